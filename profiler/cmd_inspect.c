// draftscope inspect: placeholder until the checkpoint loader lands (same change series).
#include "ds/cli.h"

#include <stdio.h>

int ds_cmd_inspect(int argc, char **argv) {
    fprintf(stderr, "draftscope inspect: not built yet\n");
    return 2;
}
