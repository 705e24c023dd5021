// draftscope render: renders one conversation turn of a dataset as the harmony prompt the
// profiler would send, with special tokens visible, for people debugging their data.
#include "ds/cli.h"
#include "ds/dataset.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: draftscope render --dataset F --index I [--turn T] --tokenizer PATH\n"
            "                         [--reasoning low|medium|high] [--date YYYY-MM-DD]\n"
            "                         [--instructions TEXT] [--max-context N] [--reply TEXT]\n"
            "                         [--ids]\n\n"
            "  --dataset F       ShareGPT (.json array or .jsonl) or question .jsonl file\n"
            "  --index I         the I-th usable conversation in file order (0-based; skipped\n"
            "                    records do not count, as in a replay)\n"
            "  --turn T          the user turn to render (1-based, default 1); earlier recorded\n"
            "                    replies become final-channel assistant messages\n"
            "  --tokenizer PATH  checkpoint directory, tokenizer.json or tiktoken ranks file;\n"
            "                    default: $DS_TOKENIZER\n"
            "  --reasoning E     reasoning effort in the system message (default medium)\n"
            "  --date D          add \"Current date: D\" to the system message\n"
            "  --instructions T  add a developer message with these instructions\n"
            "  --max-context N   fail if the prompt leaves no position to generate in N (N tokens\n"
            "                    or more), as run skips it\n"
            "  --reply TEXT      stand-in for replies a question file does not record: needed\n"
            "                    for its turn 2 and later\n"
            "  --ids             also print the ids\n");
}

static int parse_size(const char *s, size_t *out) {
    unsigned long long v;
    if (!ds_cli_parse_ull(s, &v) || v > SIZE_MAX) return 0; // digits only, no overflow
    *out = (size_t)v;
    return 1;
}

int ds_cmd_render(int argc, char **argv) {
    const char *dataset = NULL, *tok_path = getenv("DS_TOKENIZER"), *index_s = NULL;
    const char *turn_s = "1", *reasoning = "medium", *date = NULL, *instr = NULL, *max_s = "0";
    const char *reply = NULL;
    int show_ids = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **target = !strcmp(a, "--dataset")        ? &dataset
                              : !strcmp(a, "--tokenizer")    ? &tok_path
                              : !strcmp(a, "--index")        ? &index_s
                              : !strcmp(a, "--turn")         ? &turn_s
                              : !strcmp(a, "--reasoning")    ? &reasoning
                              : !strcmp(a, "--date")         ? &date
                              : !strcmp(a, "--instructions") ? &instr
                              : !strcmp(a, "--max-context")  ? &max_s
                              : !strcmp(a, "--reply")        ? &reply
                                                             : NULL;
        if (target && i + 1 < argc) {
            *target = argv[++i];
        } else if (!strcmp(a, "--ids")) {
            show_ids = 1;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else {
            // The argument as typed, its bytes escaped.
            struct ds_byte_vec shown = {0};
            ds_bytes_escape(a, strlen(a), &shown);
            fprintf(stderr, "draftscope render: %s '%s'\n\n",
                    target ? "missing value for" : a[0] != '-' ? "unexpected argument"
                                                                : "unknown option",
                    shown.data ? shown.data : "");
            ds_byte_vec_free(&shown);
            usage(stderr);
            return 2;
        }
    }
    size_t index = 0, turn = 0, max_context = 0;
    struct ds_harmony_system sys;
    ds_harmony_system_default(&sys);
    sys.current_date = date;
    sys.developer_instructions = instr;
    const char *problem = !dataset                                   ? "--dataset is required"
                          : !index_s                                 ? "--index is required"
                          : !tok_path                                ? "--tokenizer is required"
                          : !parse_size(index_s, &index) ? "--index: expected a whole number"
                          : !parse_size(turn_s, &turn) || turn < 1
                              ? "--turn: expected a whole number, 1 or more"
                          : !parse_size(max_s, &max_context)
                              ? "--max-context: expected a whole number"
                          : ds_reasoning_parse(reasoning, &sys.reasoning) ? ds_error_last()
                          : date && ds_harmony_date_check("--date", date) ? ds_error_last()
                          : ds_harmony_system_check(&sys)                 ? ds_error_last()
                                                                          : NULL;
    if (problem) {
        fprintf(stderr, "draftscope render: %s\n\n", problem);
        usage(stderr);
        return 2;
    }

    int rc = 1;
    ds_tokenizer_t *tok = NULL;
    ds_harmony_t *h = NULL;
    ds_dataset_t *ds = NULL;
    struct ds_token_vec ids = {0};
    struct ds_byte_vec text = {0};
    struct ds_dataset_options opt;
    ds_dataset_options_default(&opt);
    opt.turns = DS_TURNS_ALL;
    opt.num_conversations = index + 1;
    struct ds_dataset_turn t;
    struct ds_chat_message *msgs = NULL;
    if (ds_tokenizer_load(tok_path, &tok) || ds_harmony_create(tok, &h) ||
        ds_dataset_open(dataset, &opt, &ds))
        goto fail;
    const struct ds_dataset_stats *st = ds_dataset_stats(ds);
    if (index >= ds_dataset_num_conversations(ds)) {
        char note[512];
        const size_t skipped = ds_dataset_skip_note(ds, note, sizeof note);
        fprintf(stderr, "draftscope render: %s: --index %zu, but the file has %zu usable "
                "conversation(s)%s%s\n", dataset, index, ds_dataset_num_conversations(ds),
                skipped ? "; " : "", note);
        goto done;
    }
    if (ds_dataset_turn(ds, index, turn, &t)) goto fail;
    size_t unrecorded = 0; // replies before the turn that the file does not hold (questions)
    for (size_t i = 0; i < t.n_messages; i++) unrecorded += !t.messages[i].text;
    if (unrecorded && !reply) { // the user left out an option the turn needs: usage
        fprintf(stderr, "draftscope render: --turn %zu needs --reply TEXT: %s does not record "
                "the %zu repl%s before it\n", turn, dataset, unrecorded,
                unrecorded == 1 ? "y" : "ies");
        rc = 2;
        goto done;
    }
    if (unrecorded) { // fill the replies the file does not record
        msgs = malloc(t.n_messages * sizeof *msgs);
        if (!msgs) goto fail;
        for (size_t i = 0; i < t.n_messages; i++) {
            msgs[i] = t.messages[i];
            if (!msgs[i].text)
                msgs[i] = (struct ds_chat_message){msgs[i].role, reply, strlen(reply)};
        }
        t.messages = msgs;
    }
    enum ds_status s = ds_dataset_render(ds, h, &sys, &t, max_context, &ids);
    if (s && s != DS_ERR_RANGE) goto fail;
    if (ds_tokenizer_decode(tok, ids.ids, ids.n, &text)) goto fail;
    printf("# %s: %s, %s; record %zu at line %zu, id \"%s\"%s%s%s, turn %zu of %zu, "
           "%zu message(s)\n",
           dataset, ds_dataset_format_name(st->format),
           st->layout == DS_LAYOUT_JSONL ? "JSON Lines" : "JSON array", t.conv->dataset_index,
           t.conv->line, t.conv->id, *t.conv->category ? ", category \"" : "", t.conv->category,
           *t.conv->category ? "\"" : "", turn, t.conv->n_turns, t.n_messages);
    if (st->skipped_empty + st->skipped_malformed)
        printf("# skipped before it: %zu empty, %zu malformed (first: %s)\n", st->skipped_empty,
               st->skipped_malformed, st->first_skip);
    // The prompt as text, special tokens by name, line breaks as they are.
    printf("%s\n# %zu tokens\n", text.data, ids.n);
    if (show_ids) {
        for (size_t i = 0; i < ids.n; i++) printf(i ? " %d" : "%d", ids.ids[i]);
        putchar('\n');
    }
    if (s) goto fail; // over the context limit: shown, then reported
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "draftscope render: %s\n", ds_error_last());
done:
    free(msgs);
    ds_token_vec_free(&ids);
    ds_byte_vec_free(&text);
    ds_dataset_release(ds);
    ds_harmony_release(h);
    ds_tokenizer_release(tok);
    return rc;
}
