#!/bin/sh
# bench_dataset's command line: --help, and a one-line error with exit 2 for an unknown option, a
# missing value and a bad number. The old parser read options in pairs: a lone last option was
# dropped and the benchmark ran on the defaults, and atol() took "abc" as 0 conversations. Every
# case that could reach the generator names a small --synth file first, so that a parser that lets
# it through writes a few conversations in WORKDIR rather than the 650 MB default file in /tmp.
# Usage: bench_dataset_options.sh BENCH_DATASET WORKDIR
set -u
bench=$1 work=$2
mkdir -p "$work"
synth="$work/synth.json"
rm -f "$synth"
passed=0 failed=0

# check NAME WANT_STATUS STREAM WANT_TEXT ARGS...: runs bench_dataset with ARGS, then wants the
# exit status and WANT_TEXT as the first line of STREAM (out or err).
check() {
    name=$1 want_rc=$2 stream=$3 want=$4
    shift 4
    "$bench" "$@" > "$work/out" 2> "$work/err"
    rc=$?
    first=$(head -n 1 "$work/$stream")
    if [ "$rc" -eq "$want_rc" ] && [ "$first" = "$want" ]; then
        passed=$((passed + 1))
        echo "ok $name"
    else
        failed=$((failed + 1))
        echo "not ok $name: exit $rc (want $want_rc), first line of std$stream:"
        echo "  got:  $first"
        echo "  want: $want"
    fi
}

want_int="bench_dataset: --conversations wants an integer in 1..1000000, got"
check help 0 out "usage: bench_dataset [--file F] [--synth F] [--conversations N]" \
    --synth "$synth" --conversations 3 --help
check unknown_option 2 err "bench_dataset: unknown option '--bogus'" \
    --synth "$synth" --conversations 3 --bogus
check missing_value 2 err "bench_dataset: missing value for '--file'" \
    --synth "$synth" --conversations 3 --file
check not_a_number 2 err "$want_int 'abc'" --synth "$synth" --conversations abc
check trailing_junk 2 err "$want_int '12x'" --synth "$synth" --conversations 12x
check zero 2 err "$want_int '0'" --synth "$synth" --conversations 0
check missing_file 1 err "$work/none.json: not found" --file "$work/none.json"

# No usage error wrote a file.
if [ -e "$synth" ]; then
    failed=$((failed + 1))
    echo "not ok nothing_generated: a refused command line wrote $synth"
else
    passed=$((passed + 1))
    echo "ok nothing_generated"
fi

# A good command line still runs every step.
rm -f "$synth"
"$bench" --synth "$synth" --conversations 3 > "$work/out" 2> "$work/err"
rc=$?
if [ "$rc" -eq 0 ] && grep -q "^generated $synth in " "$work/out" &&
    grep -q "^all, every turn .* records 3, " "$work/out"; then
    passed=$((passed + 1))
    echo "ok runs"
else
    failed=$((failed + 1))
    echo "not ok runs: exit $rc"
    cat "$work/out" "$work/err"
fi
# Run again with another count: the existing file is used, and the first line says so.
check conversations_ignored 0 out \
    "--conversations 5 ignored: $synth exists and is used as it is (remove it to generate it again)" \
    --synth "$synth" --conversations 5
grep -q "^all, every turn .* records 3, " "$work/out" && ok=1 || ok=0
[ $ok -eq 1 ] && passed=$((passed + 1)) || failed=$((failed + 1))
[ $ok -eq 1 ] && echo "ok existing_file_used" || { echo "not ok existing_file_used"; cat "$work/out"; }
rm -f "$synth" "$work/out" "$work/err"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
