"""The run file's schema, mirrored from profiler/include/ds/record.h (docs/hdf5-schema.md).

Every table is a 1-D HDF5 compound dataset; TABLES lists, per table, its fields in file order with
their numpy dtypes (enums are u8 codes whose names are in ENUMS). A test reads a file written by
the C test suite and checks it against these lists, and checks SCHEMA_VERSION against
DS_RECORD_SCHEMA_VERSION in record.h, so the two cannot drift apart silently.
"""

SCHEMA_NAME = "draftscope-run"
SCHEMA_VERSION = 2          # the version this package reads (DS_RECORD_SCHEMA_VERSION)
READ_VERSIONS = (1, 2)      # versions it also accepts: older files lack the fields in ADDED_IN
# (table, field) -> the schema version that added it; an older file reads it as 0.
ADDED_IN = {("sessions", "trace_dropped"): 2}
MAX_LAYERS = 64             # DS_RECORD_MAX_LAYERS: steps.distinct_experts entries
STRING_BYTES = 1016         # DS_RECORD_STRING_BYTES: strings.text capacity

ENUMS = {
    "channel": ["header", "analysis", "commentary", "final", "other"],
    "stop_reason": ["return", "call", "endoftext", "max_new_tokens", "context_limit", "error"],
    "phase": ["prefill", "draft_extend", "draft_step", "verify", "accept", "sample"],
    "status": ["running", "closed", "interrupted", "failed"],
    "trace_level": ["off", "phases", "kernels"],
}

# (field, numpy dtype string, enum name or None); "(64,)u2" is a fixed array, "S1016" fixed bytes.
TABLES = {
    "drafts": [
        ("step", "u8", None), ("request", "u4", None), ("draft_token", "i4", None),
        ("q_draft", "f4", None), ("p_draft", "f4", None), ("target_token", "i4", None),
        ("p_target", "f4", None), ("margin", "f4", None), ("expected_accept", "f4", None),
        ("entropy_target", "f4", None), ("entropy_draft", "f4", None),
        ("context_len", "u4", None), ("batch_size", "u2", None), ("position", "u1", None),
        ("accepted", "u1", None), ("channel", "u1", "channel"),
    ],
    "steps": [
        ("step", "u8", None), ("draft_ns", "u8", None), ("verify_ns", "u8", None),
        ("accept_ns", "u8", None), ("total_ns", "u8", None), ("request", "u4", None),
        ("context_len", "u4", None), ("batch_size", "u2", None), ("turn", "u2", None),
        ("drafted", "u1", None), ("accepted", "u1", None), ("emitted", "u1", None),
        ("nonfinite", "u1", None), ("distinct_experts", "(64,)u2", None),
    ],
    "requests": [
        ("start_ns", "u8", None), ("end_ns", "u8", None), ("request", "u4", None),
        ("dataset_index", "u4", None), ("category", "u4", None), ("conversation", "u4", None),
        ("prompt_len", "u4", None), ("generated_len", "u4", None), ("steps", "u4", None),
        ("batch_size", "u2", None), ("turn", "u2", None), ("session", "u2", None),
        ("stop_reason", "u1", "stop_reason"),
    ],
    "kernels": [
        ("step", "u8", None), ("start_ns", "u8", None), ("end_ns", "u8", None),
        ("graph_node", "u8", None), ("name", "u4", None), ("stream", "u4", None),
        ("grid_x", "u4", None), ("grid_y", "u4", None), ("grid_z", "u4", None),
        ("block_x", "u4", None), ("block_y", "u4", None), ("block_z", "u4", None),
        ("static_smem", "u4", None), ("dynamic_smem", "u4", None), ("correlation", "u4", None),
        ("registers", "u2", None), ("phase", "u1", "phase"), ("draft_step", "u1", None),
    ],
    "ranges": [
        ("step", "u8", None), ("start_ns", "u8", None), ("end_ns", "u8", None),
        ("batch_size", "u2", None), ("phase", "u1", "phase"), ("draft_step", "u1", None),
    ],
    "strings": [
        ("id", "u4", None), ("length", "u4", None), ("text", "S1016", None),
    ],
    "sessions": [
        ("start_unix_ns", "u8", None), ("end_unix_ns", "u8", None), ("first_step", "u8", None),
        ("next_step", "u8", None), ("trace_overhead", "f8", None), ("trace_dropped", "u8", None),
        ("command_line", "u4", None), ("session", "u2", None), ("status", "u1", "status"),
        ("trace_level", "u1", "trace_level"),
    ],
}

# Row sizes in bytes (the C structs, padding included).
ROW_BYTES = {"drafts": 64, "steps": 184, "requests": 56, "kernels": 80, "ranges": 32,
             "strings": 1024, "sessions": 56}

STRING_ATTRS = ["schema", "tool_version", "git_commit", "command_line", "gpu_name",
                "driver_version", "cuda_version", "target_path", "target_config_sha256",
                "draft_path", "draft_config_sha256", "dataset_path", "dataset_sha256", "rule",
                "trace_level", "options_json"]
NUMBER_ATTRS = ["schema_version", "seed", "k", "temperature", "top_p", "created_unix_ns"]
INTEGER_ATTRS = ["schema_version", "seed", "k", "created_unix_ns"]  # stored as integer types
ARRAY_ATTRS = ["batch_sizes"]


def field_names(table):
    return [f for f, _, _ in TABLES[table]]


def enum_fields(table):
    return {f: e for f, _, e in TABLES[table] if e}
