/* One request's output (output.h). */
#include "output.h"

#include <stdlib.h>
#include <string.h>

#include "detok.h"
#include "tokenizer.h"

typedef struct {
    char *p;
    size_t len, cap;
} buf_t;

static int buf_add(buf_t *b, const char *s, size_t n)
{
    if (!n)
        return 0;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p)
            return -1;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

struct duet_out {
    duet_out_opts_t o;
    duet_detok_t *dt;
    duet_dsml_parser_t *dp;
    buf_t content, reasoning;         /* whole output */
    buf_t new_content, new_reasoning; /* not yet taken */
    buf_t take;                       /* the last take_text result */
    json_t *calls, *new_calls;
    json_t *warnings, *new_warnings;
    size_t n_fed;
    int finished, nomem;
};

static duet_status_t text_in(duet_out_t *o, const char *t, size_t n);

static const uint8_t *vocab_bytes(void *arg, int32_t id, size_t *len)
{
    return (const uint8_t *)duet_tok_id_bytes(arg, id, len);
}

static int vocab_special(void *arg, int32_t id) { return duet_tok_is_special(arg, id); }

static void on_dsml(void *arg, const duet_dsml_event_t *ev)
{
    duet_out_t *o = arg;
    switch (ev->kind) {
    case DUET_DSML_EV_CONTENT:
        o->nomem |= buf_add(&o->content, ev->text, ev->len) | buf_add(&o->new_content, ev->text, ev->len);
        break;
    case DUET_DSML_EV_REASONING:
        o->nomem |= buf_add(&o->reasoning, ev->text, ev->len) | buf_add(&o->new_reasoning, ev->text, ev->len);
        break;
    case DUET_DSML_EV_TOOL_CALL: {
        json_t *c = json_object(), *f = json_object();
        json_object_set_new(c, "index", json_integer(ev->index));
        json_object_set_new(c, "id", json_string(ev->id));
        json_object_set_new(c, "type", json_string("function"));
        json_object_set_new(f, "name", json_string(ev->name));
        json_object_set_new(f, "arguments", json_string(ev->arguments));
        json_object_set_new(c, "function", f);
        json_array_append(o->calls, c);
        json_array_append_new(o->new_calls, c);
        break;
    }
    case DUET_DSML_EV_ERROR:
        /* the failed block goes back to the client as the plain text the model wrote */
        o->nomem |= buf_add(&o->content, ev->text, ev->len) | buf_add(&o->new_content, ev->text, ev->len);
        duet_out_warn(o, duet_dsml_code_str(ev->code), ev->message ? ev->message : duet_dsml_code_message(ev->code));
        break;
    }
}

duet_status_t duet_out_create(const duet_out_opts_t *opts, duet_out_t **out)
{
    duet_out_t *o = calloc(1, sizeof *o);
    if (!o)
        return DUET_ERR_NOMEM;
    o->o = *opts;
    o->calls = json_array();
    o->new_calls = json_array();
    o->warnings = json_array();
    o->new_warnings = json_array();
    duet_detok_vocab_t v = {.token_bytes = vocab_bytes, .is_special = vocab_special, .arg = (void *)opts->tok};
    duet_detok_opts_t dopt = {.skip_special_tokens = opts->skip_special_tokens, .stop = opts->stop,
                              .n_stop = opts->n_stop};
    duet_status_t st = duet_detok_create(&v, &dopt, &o->dt);
    if (st == DUET_OK && opts->chat) {
        duet_dsml_opts_t po = {.thinking = opts->thinking, .tools = opts->tools, .id_seed = opts->id_seed};
        st = duet_dsml_parser_create(&po, on_dsml, o, &o->dp);
    }
    if (st == DUET_OK && opts->prefix_len)
        st = text_in(o, opts->prefix, opts->prefix_len);
    if (st != DUET_OK || !o->calls || !o->new_calls || !o->warnings || !o->new_warnings) {
        duet_out_destroy(&o);
        return st != DUET_OK ? st : DUET_ERR_NOMEM;
    }
    *out = o;
    return DUET_OK;
}

void duet_out_destroy(duet_out_t **po)
{
    duet_out_t *o = po ? *po : NULL;
    if (!o)
        return;
    duet_detok_destroy(&o->dt);
    duet_dsml_parser_destroy(&o->dp);
    free(o->content.p);
    free(o->reasoning.p);
    free(o->new_content.p);
    free(o->new_reasoning.p);
    free(o->take.p);
    json_decref(o->calls);
    json_decref(o->new_calls);
    json_decref(o->warnings);
    json_decref(o->new_warnings);
    free(o);
    *po = NULL;
}

static duet_status_t text_in(duet_out_t *o, const char *t, size_t n)
{
    if (!n)
        return DUET_OK;
    if (o->dp)
        return duet_dsml_parser_feed(o->dp, t, n);
    if (buf_add(&o->content, t, n) || buf_add(&o->new_content, t, n))
        return DUET_ERR_NOMEM;
    return DUET_OK;
}

duet_status_t duet_out_feed(duet_out_t *o, const int32_t *ids, size_t n)
{
    if (o->finished)
        return DUET_ERR_STATE;
    const char *t = NULL;
    size_t len = 0;
    o->n_fed += n;
    duet_status_t st = duet_detok_feed(o->dt, ids, n, &t, &len);
    duet_status_t st2 = text_in(o, t, len);
    if (st == DUET_OK)
        st = st2;
    return o->nomem ? DUET_ERR_NOMEM : st;
}

duet_status_t duet_out_finish(duet_out_t *o)
{
    if (o->finished)
        return DUET_OK;
    o->finished = 1;
    const char *t = NULL;
    size_t len = 0;
    duet_status_t st = duet_detok_finish(o->dt, &t, &len);
    if (st == DUET_OK)
        st = text_in(o, t, len);
    if (st == DUET_OK && o->dp)
        st = duet_dsml_parser_finish(o->dp);
    return o->nomem ? DUET_ERR_NOMEM : st;
}

int duet_out_stopped(const duet_out_t *o) { return duet_detok_stopped(o->dt, NULL); }

size_t duet_out_n_tokens(const duet_out_t *o)
{
    duet_detok_stop_t w;
    if (duet_detok_stopped(o->dt, &w))
        return w.token_index + 1;
    return o->n_fed;
}

int duet_out_n_calls(const duet_out_t *o) { return (int)json_array_size(o->calls); }

json_t *duet_out_take_delta(duet_out_t *o)
{
    if (!o->new_content.len && !o->new_reasoning.len && !json_array_size(o->new_calls))
        return NULL;
    json_t *d = json_object();
    if (o->new_reasoning.len)
        json_object_set_new(d, "reasoning_content", json_stringn(o->new_reasoning.p, o->new_reasoning.len));
    if (o->new_content.len)
        json_object_set_new(d, "content", json_stringn(o->new_content.p, o->new_content.len));
    if (json_array_size(o->new_calls)) {
        json_object_set(d, "tool_calls", o->new_calls);
        json_decref(o->new_calls);
        o->new_calls = json_array();
    }
    o->new_content.len = o->new_reasoning.len = 0;
    return d;
}

const char *duet_out_take_text(duet_out_t *o, size_t *len)
{
    if (!o->new_content.len)
        return NULL;
    buf_t t = o->take;
    o->take = o->new_content;
    o->new_content = t;
    o->new_content.len = 0;
    *len = o->take.len;
    return o->take.p;
}

json_t *duet_out_take_warnings(duet_out_t *o)
{
    if (!json_array_size(o->new_warnings))
        return NULL;
    json_t *w = o->new_warnings;
    o->new_warnings = json_array();
    return w;
}

const char *duet_out_content(const duet_out_t *o, size_t *len)
{
    *len = o->content.len;
    return o->content.p ? o->content.p : "";
}

const char *duet_out_reasoning(const duet_out_t *o, size_t *len)
{
    *len = o->reasoning.len;
    return o->reasoning.p ? o->reasoning.p : "";
}

const json_t *duet_out_tool_calls(const duet_out_t *o) { return o->calls; }
const json_t *duet_out_warnings(const duet_out_t *o) { return o->warnings; }

duet_dsml_code_t duet_out_dsml_error(const duet_out_t *o)
{
    return o->dp ? duet_dsml_parser_error(o->dp) : DUET_DSML_OK;
}

void duet_out_warn(duet_out_t *o, const char *code, const char *message)
{
    json_t *w = json_object();
    json_object_set_new(w, "code", json_string(code));
    json_t *m = json_string(message);
    json_object_set_new(w, "message", m ? m : json_string("(message not valid UTF-8)"));
    json_array_append(o->warnings, w);
    json_array_append_new(o->new_warnings, w);
}
