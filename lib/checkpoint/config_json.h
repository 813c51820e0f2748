/* config.json's text -> parity_config (lib/checkpoint/config_json.c). */
#ifndef PARITY_CONFIG_JSON_H
#define PARITY_CONFIG_JSON_H

#include <stddef.h>

#include "parity.h"

/* Parses config.json text (path for messages), validated as config_validate does. */
int config_parse(const char *text, size_t len, const char *path, parity_config *out);

#endif
