/* Fuzz target: the input is a whole .safetensors file image (u64 LE header
 * length, header JSON, data section).  The framing checks mirror
 * duet_st_file_open; the header goes through duet_st_parse_header.  The input
 * is copied to an exact-size heap buffer so sanitizers catch any read past
 * `size`.  Accepted headers are checked against the reader's invariants. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    duet_st_tensor_t *t = NULL;
    size_t n = 0;
    duet_err_t err = {0};
    uint64_t hlen = 0;

    if (size < 8)
        return 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | data[i];
    if (hlen > DUET_ST_MAX_HEADER || hlen > size - 8)
        return 0;
    char *copy = malloc(hlen ? (size_t)hlen : 1);
    if (!copy)
        return 0;
    memcpy(copy, data + 8, (size_t)hlen);
    uint64_t data_len = size - 8 - hlen;
    duet_status_t st = duet_st_parse_header(copy, (size_t)hlen, data_len, "fuzz.safetensors", &t, &n, &err);
    if (st == DUET_OK) {
        for (size_t i = 0; i < n; i++) {
            size_t want;
            if (!t[i].name || (i && strcmp(t[i - 1].name, t[i].name) >= 0))
                abort(); /* not sorted or duplicate */
            if (duet_st_expected_bytes(t[i].dtype, t[i].ndim, t[i].shape, &want) != 0 || want != t[i].nbytes)
                abort();
            if (t[i].offset > data_len || t[i].nbytes > data_len - t[i].offset)
                abort();
        }
        duet_st_tensors_free(t, n);
    } else if (st != err.status || !strstr(err.msg, "fuzz.safetensors")) {
        abort(); /* every error names the file */
    }
    free(copy);
    return 0;
}
