// ds/sha256.h: SHA-256 (FIPS 180-4) for the run file's config and dataset hashes.
//
// A compact, dependency-free implementation: the hashes identify the exact model configs and
// dataset a run used, and let a resumed run check it is continuing the same run.
#ifndef DS_SHA256_H
#define DS_SHA256_H

#include <stddef.h>
#include <stdint.h>

#include "ds/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DS_SHA256_HEX_BYTES 65 // 64 lowercase hex digits + NUL

// Incremental hashing: init, update any number of times, final.
struct ds_sha256 {
    uint32_t h[8];
    uint64_t bytes;    // message length so far
    uint8_t block[64]; // pending partial block
    size_t fill;       // bytes in block
};

void ds_sha256_init(struct ds_sha256 *s);
void ds_sha256_update(struct ds_sha256 *s, const void *data, size_t n);
// Writes the digest as 64 lowercase hex digits + NUL into hex_out (DS_SHA256_HEX_BYTES bytes).
void ds_sha256_final_hex(struct ds_sha256 *s, char hex_out[DS_SHA256_HEX_BYTES]);

// Hex digest of a memory buffer.
void ds_sha256_hex(const void *data, size_t n, char hex_out[DS_SHA256_HEX_BYTES]);

// Hex digest of a whole file. Errors: DS_ERR_ARG (NULL), DS_ERR_IO (cannot open or read; the
// message names the file). hex_out is "" on failure.
enum ds_status ds_sha256_file(const char *path, char hex_out[DS_SHA256_HEX_BYTES]);

#ifdef __cplusplus
}
#endif
#endif // DS_SHA256_H
