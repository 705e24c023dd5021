// Reading a file's attributes: shared by the recorder (its resume checks) and the summary, both of
// which read files that may be malformed. Nothing is read past what the caller asked for: a value
// is read only when the attribute holds exactly one element.
#ifndef DS_PROFILER_H5ATTR_H
#define DS_PROFILER_H5ATTR_H

#include <hdf5.h>
#include <stddef.h>

// The attribute `name` of `loc` as a new NUL-terminated string (free() it): a variable- or
// fixed-length string of one element. NULL when absent, of another class, not one element, or
// when memory runs out.
char *ds_h5_attr_strdup(hid_t loc, const char *name);

// The same into buf (truncated to n - 1 bytes, buf "" on failure); 0, or -1 as NULL above.
int ds_h5_attr_str(hid_t loc, const char *name, char *buf, size_t n);

// One numeric element converted to `native` into *v; -1 when absent, not one element, or not
// convertible (a string, say; a float where `native` is an integer type).
int ds_h5_attr_num(hid_t loc, const char *name, hid_t native, void *v);

#endif
