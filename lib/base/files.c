/* The one capped whole-file reader of the library (files.h). */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "files.h"
#include "alloc.h"
#include "errors.h"

int read_file_capped(const char *path, size_t limit, int oversize_status, char **out,
                     size_t *len) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return set_error(PARITY_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char *buf = NULL;
    size_t n = 0, cap = 0;
    int rc = PARITY_OK;
    for (;;) {
        if (n == cap) {
            if (cap >= limit) {
                rc = set_error(oversize_status, "%s: larger than %zu bytes", path, limit);
                break;
            }
            cap = cap ? 2 * cap : 4096;
            char *grown = px_realloc(buf, cap, path);
            if (!grown) {
                rc = PARITY_ERR_OUT_OF_MEMORY;
                break;
            }
            buf = grown;
        }
        const size_t got = fread(buf + n, 1, cap - n, fp);
        n += got;
        if (got == 0) break;
    }
    if (rc == PARITY_OK && ferror(fp))
        rc = set_error(PARITY_ERR_IO, "%s: read failed: %s", path, strerror(errno));
    fclose(fp);
    if (rc) {
        px_free(buf);
        return rc;
    }
    *out = buf;
    *len = n;
    return PARITY_OK;
}
