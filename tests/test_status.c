// The status enum and the per-thread error message.
#include "harness.h"

static void names_are_distinct_and_bounded(void) {
    EXPECT_EQ_STR(ds_status_str(DS_OK), "ok");
    EXPECT_EQ_STR(ds_status_str(DS_ERR_FORMAT), "format");
    EXPECT_EQ_STR(ds_status_str((enum ds_status)999), "unknown");
    for (int a = 0; a < DS_STATUS_COUNT; a++)
        for (int b = a + 1; b < DS_STATUS_COUNT; b++)
            EXPECT(strcmp(ds_status_str((enum ds_status)a), ds_status_str((enum ds_status)b)));
}

static void error_message_is_kept_and_returned(void) {
    enum ds_status s = ds_error_set(DS_ERR_IO, "%s: cannot open (%d)", "x.safetensors", 2);
    EXPECT_EQ_INT(s, DS_ERR_IO);
    EXPECT_EQ_STR(ds_error_last(), "x.safetensors: cannot open (2)");
    ds_error_clear();
    EXPECT_EQ_STR(ds_error_last(), "");
}

// A message built from the last one (the loaders' "%s: ...", ds_error_last() prefixes): the
// formatting read the buffer it was writing, and the text repeated or was lost.
static void error_message_may_quote_itself(void) {
    ds_error_set(DS_ERR_NOMEM, "backend: out of memory for 4096 positions");
    ds_error_set(DS_ERR_NOMEM, "t: cannot allocate the KV cache (%s)", ds_error_last());
    EXPECT_EQ_STR(ds_error_last(),
                  "t: cannot allocate the KV cache (backend: out of memory for 4096 positions)");
    ds_error_set(DS_ERR_IO, "%s", ds_error_last()); // kept as it is
    EXPECT_EQ_STR(ds_error_last(),
                  "t: cannot allocate the KV cache (backend: out of memory for 4096 positions)");
}

int main(void) {
    DS_RUN(names_are_distinct_and_bounded);
    DS_RUN(error_message_is_kept_and_returned);
    DS_RUN(error_message_may_quote_itself);
    return ds_test_end();
}
