// SHA-256 (ds/sha256.h) against the FIPS 180-2 / NIST example vectors.
#include "harness.h"

#include "ds/sha256.h"

#include <unistd.h>

static void nist_vectors(void) {
    char hex[DS_SHA256_HEX_BYTES];
    ds_sha256_hex("", 0, hex);
    EXPECT_EQ_STR(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    ds_sha256_hex("abc", 3, hex);
    EXPECT_EQ_STR(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    // 56 bytes: the padding spills into a second block.
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    ds_sha256_hex(two, strlen(two), hex);
    EXPECT_EQ_STR(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

static void million_a_in_uneven_pieces(void) {
    // One million 'a', fed in pieces of 1..97 bytes so every partial-block path runs.
    static char a[100];
    memset(a, 'a', sizeof a);
    struct ds_sha256 s;
    ds_sha256_init(&s);
    size_t done = 0;
    for (size_t piece = 1; done < 1000000; piece = piece % 97 + 1) {
        size_t n = 1000000 - done < piece ? 1000000 - done : piece;
        ds_sha256_update(&s, a, n);
        done += n;
    }
    char hex[DS_SHA256_HEX_BYTES];
    ds_sha256_final_hex(&s, hex);
    EXPECT_EQ_STR(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

static void file_hash_and_errors(void) {
    char path[600];
    snprintf(path, sizeof path, "%s/test_sha256.%d.txt", DS_BINARY_DIR, (int)getpid());
    FILE *f = fopen(path, "wb");
    EXPECT(f != NULL);
    if (!f) return;
    fputs("abc", f);
    fclose(f);
    char hex[DS_SHA256_HEX_BYTES];
    EXPECT_OK(ds_sha256_file(path, hex));
    EXPECT_EQ_STR(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    unlink(path);
    EXPECT_STATUS(ds_sha256_file(path, hex), DS_ERR_IO);
    EXPECT_ERROR_HAS(path);
    EXPECT_EQ_STR(hex, "");
}

int main(void) {
    DS_RUN(nist_vectors);
    DS_RUN(million_a_in_uneven_pieces);
    DS_RUN(file_hash_and_errors);
    return ds_test_end();
}
