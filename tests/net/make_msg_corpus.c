/* Writes the stored fuzz corpus of the envelope decoder (tests/fuzz/corpus/msg):
 * a valid message of every kind, then truncated, bit-flipped, wrong-version,
 * header-less, body-less, out-of-range and oversized-length variants, and raw
 * garbage.  Deterministic: the same build writes the same files.
 *
 *   make_msg_corpus DIR */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "msg_samples.h"

static const char *g_dir;
static int g_written;

static void put(const char *name, const uint8_t *buf, size_t len)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || (len && fwrite(buf, 1, len, f) != len) || fclose(f) != 0) {
        fprintf(stderr, "make_msg_corpus: cannot write %s\n", path);
        exit(1);
    }
    g_written++;
}

static uint8_t *pack(duet_msg_kind_t kind, size_t *len)
{
    duet_envelope_t *e = sample_msg(kind);
    uint8_t *buf = sample_pack_raw(e, len);
    duet_envelope_free(&e);
    return buf;
}

/* Mutate a sample, write it raw (without validation). */
static void put_mutated(const char *name, duet_msg_kind_t kind, void (*mutate)(duet_envelope_t *))
{
    size_t len;
    duet_envelope_t *e = sample_msg(kind);
    mutate(e);
    uint8_t *buf = sample_pack_raw(e, &len);
    put(name, buf, len);
    free(buf);
    duet_envelope_free(&e);
}

static void version_2(duet_envelope_t *e) { e->header->version = 2; }
static void version_0(duet_envelope_t *e) { e->header->version = 0; }
static void no_header(duet_envelope_t *e)
{
    duet_msg_free(&e->header->base);
    e->header = NULL;
}
static void no_body(duet_envelope_t *e)
{
    duet_msg_free(&e->ack->base);
    e->ack = NULL;
    e->body_case = DUET__V1__ENVELOPE__BODY__NOT_SET;
}
static void page_out_of_range(duet_envelope_t *e) { e->prefill->descriptor->page_ids[0] = 5000; }
static void negative_token(duet_envelope_t *e) { e->prefill->tokens[2] = -7; }
static void unknown_reason(duet_envelope_t *e) { e->abort->reason = (Duet__V1__AbortReason)77; }
static void checksum_lengths(duet_envelope_t *e) { e->transfer_done->checksums->n_page = 2; }
static void bad_rid(duet_envelope_t *e) { duet_msg_set_str(&e->header->rid, "rid with spaces"); }

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: make_msg_corpus DIR\n");
        return 2;
    }
    g_dir = argv[1];
    char name[128];
    size_t len;

    for (int i = 0; i < n_sample_kinds; i++) {
        uint8_t *buf = pack(sample_kinds[i], &len);
        snprintf(name, sizeof name, "valid_%s.bin", duet_msg_kind_name(sample_kinds[i]));
        put(name, buf, len);
        free(buf);
    }

    uint8_t *buf = pack(DUET__V1__ENVELOPE__BODY_PREFILL, &len);
    put("trunc_prefill_half.bin", buf, len / 2);
    put("trunc_prefill_last_byte.bin", buf, len - 1);
    put("trunc_prefill_1.bin", buf, 1);
    for (size_t bit = 3; bit < len * 8; bit += len * 8 / 3) {
        buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        snprintf(name, sizeof name, "flip_prefill_bit%zu.bin", bit);
        put(name, buf, len);
        buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    }
    free(buf);
    buf = pack(DUET__V1__ENVELOPE__BODY_RESERVED, &len);
    put("trunc_reserved_third.bin", buf, len / 3);
    buf[len / 2] ^= 0x80;
    put("flip_reserved_mid.bin", buf, len);
    free(buf);
    buf = pack(DUET__V1__ENVELOPE__BODY_TRANSFER_DONE, &len);
    put("trunc_transfer_done_last_byte.bin", buf, len - 1);
    free(buf);

    put_mutated("version_2_reserve.bin", DUET__V1__ENVELOPE__BODY_RESERVE, version_2);
    put_mutated("version_0_token_chunk.bin", DUET__V1__ENVELOPE__BODY_TOKEN_CHUNK, version_0);
    put_mutated("no_header_abort.bin", DUET__V1__ENVELOPE__BODY_ABORT, no_header);
    put_mutated("no_body.bin", DUET__V1__ENVELOPE__BODY_ACK, no_body);
    put_mutated("range_page_id.bin", DUET__V1__ENVELOPE__BODY_PREFILL, page_out_of_range);
    put_mutated("range_negative_token.bin", DUET__V1__ENVELOPE__BODY_PREFILL, negative_token);
    put_mutated("enum_unknown_abort_reason.bin", DUET__V1__ENVELOPE__BODY_ABORT, unknown_reason);
    put_mutated("proto_checksum_lengths.bin", DUET__V1__ENVELOPE__BODY_TRANSFER_DONE, checksum_lengths);
    put_mutated("proto_bad_rid.bin", DUET__V1__ENVELOPE__BODY_TOKEN_CHUNK, bad_rid);

    /* oversized lengths: a body (field 15, length-delimited) claiming 2^62
     * bytes, and a packed token list inside a prefill claiming 2^31 bytes */
    static const uint8_t huge_len[] = {0x7a, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x40, 0x01};
    put("len_body_2e62.bin", huge_len, sizeof huge_len);
    static const uint8_t huge_packed[] = {0x7a, 0x07, 0x0a, 0x05, 0x80, 0x80, 0x80, 0x80, 0x08};
    put("len_packed_2e31.bin", huge_packed, sizeof huge_packed);
    /* a varint that never ends */
    static const uint8_t endless[] = {0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    put("varint_endless.bin", endless, sizeof endless);

    /* a valid Ack followed by a field-0 tag in non-canonical form */
    buf = pack(DUET__V1__ENVELOPE__BODY_ACK, &len);
    uint8_t *tagged = malloc(len + 3);
    memcpy(tagged, buf, len);
    memcpy(tagged + len, "\x80\x00\x00", 3);
    put("tag_field_zero.bin", tagged, len + 3);
    free(tagged);
    free(buf);

    uint8_t junk[64];
    memset(junk, 0xff, sizeof junk);
    put("garbage_ff.bin", junk, sizeof junk);
    put("empty.bin", junk, 0);

    printf("make_msg_corpus: wrote %d files to %s\n", g_written, g_dir);
    return 0;
}
