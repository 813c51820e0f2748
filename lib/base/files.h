/* Reading a whole file into memory, up to a size cap: config.json, a shard index, a manifest. */
#ifndef PARITY_FILES_H
#define PARITY_FILES_H

#include <stddef.h>

/* The bytes of the file at `path` into a new buffer *out (px_free it) of *len bytes. A file
 * of `limit` bytes or more is refused with `oversize_status` ("PATH: larger than LIMIT
 * bytes"); PARITY_ERR_IO when it cannot be opened or read. Nothing is left allocated on
 * failure. */
int read_file_capped(const char *path, size_t limit, int oversize_status, char **out,
                     size_t *len);

#endif
