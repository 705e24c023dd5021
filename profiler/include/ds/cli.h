// ds/cli.h: the draftscope subcommands. Each takes the arguments after its name (argv[0] is the
// subcommand name) and returns the process exit code: 0 success, 1 a problem with the input
// (printed as one line naming the file and the problem), 2 usage error.
#ifndef DS_CLI_H
#define DS_CLI_H

#ifdef __cplusplus
extern "C" {
#endif

int ds_cmd_run(int argc, char **argv);
int ds_cmd_inspect(int argc, char **argv);
int ds_cmd_generate(int argc, char **argv);
int ds_cmd_tokenize(int argc, char **argv);
int ds_cmd_render(int argc, char **argv);
int ds_cmd_bench(int argc, char **argv);
int ds_cmd_summary(int argc, char **argv);

#ifdef __cplusplus
}
#endif
#endif // DS_CLI_H
