// Number parsing shared by the subcommands' option parsers (ds/cli.h).
#include "ds/cli.h"

#include <errno.h>
#include <stdlib.h>

bool ds_cli_parse_ll(const char *s, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    const long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

bool ds_cli_parse_ull(const char *s, unsigned long long *out) {
    char *end;
    errno = 0;
    // strtoull accepts a sign (and wraps "-1"): digits only.
    if (*s < '0' || *s > '9') return false;
    const unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return false;
    *out = v;
    return true;
}
