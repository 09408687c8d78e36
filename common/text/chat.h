/* DeepSeek-V4 chat encoding: OpenAI-style messages and tools to the prompt
 * text the model was trained on.
 *
 * The output follows the official DeepSeek-V4 encoder (encoding_dsv4.py)
 * byte for byte: BOS, system text, the tools section, <｜User｜> and
 * <｜Assistant｜> turns with <think> / </think>, reasoning of earlier turns
 * dropped, assistant tool calls written as DSML, tool results merged into
 * the next user turn as <tool_result>, the latest-reminder role, EOS after
 * each assistant turn.  docs/TEXT.md ("Chat encoding") describes the format
 * and every choice made where the official encoder says nothing.
 *
 * Special tokens appear in the output as their text; tokenize it with
 * special tokens allowed.  The encoder never changes its inputs. */
#ifndef DUET_TEXT_CHAT_H
#define DUET_TEXT_CHAT_H

#include <stddef.h>

#include <jansson.h>

#include "err.h"

/* Special-token texts (full-width ｜ U+FF5C, ▁ U+2581). */
#define DUET_CHAT_BOS             "<｜begin▁of▁sentence｜>"
#define DUET_CHAT_EOS             "<｜end▁of▁sentence｜>"
#define DUET_CHAT_USER            "<｜User｜>"
#define DUET_CHAT_ASSISTANT       "<｜Assistant｜>"
#define DUET_CHAT_LATEST_REMINDER "<｜latest_reminder｜>"
#define DUET_CHAT_THINK_START     "<think>"
#define DUET_CHAT_THINK_END       "</think>"
#define DUET_CHAT_DSML            "｜DSML｜"

/* Reasoning effort.  DEFAULT is the profile's default (HIGH for the preview
 * profile, LOW for the official one). */
typedef enum {
    DUET_CHAT_EFFORT_DEFAULT = 0,
    DUET_CHAT_EFFORT_LOW,
    DUET_CHAT_EFFORT_HIGH,
    DUET_CHAT_EFFORT_MAX,
} duet_chat_effort_t;

/* Which effort prompts a checkpoint was trained with.  PREVIEW (the first
 * V4 release) knows high and max and prefixes only max; OFFICIAL knows
 * low, high and max and prefixes high and max with different texts. */
typedef enum {
    DUET_CHAT_PROFILE_PREVIEW = 0,
    DUET_CHAT_PROFILE_OFFICIAL,
} duet_chat_effort_profile_t;

/* Internal classification tasks: a task token is appended after the last
 * user or developer message instead of the normal generation prompt. */
typedef enum {
    DUET_CHAT_TASK_NONE = 0,
    DUET_CHAT_TASK_ACTION,
    DUET_CHAT_TASK_QUERY,
    DUET_CHAT_TASK_AUTHORITY,
    DUET_CHAT_TASK_DOMAIN,
    DUET_CHAT_TASK_TITLE,
    DUET_CHAT_TASK_READ_URL,
} duet_chat_task_t;

/* Options; all-zero is the default (chat mode, earlier reasoning dropped,
 * BOS added, default effort of the preview profile, no task). */
typedef struct {
    int thinking;          /* thinking mode: the generation prompt opens <think> */
    int keep_reasoning;    /* keep reasoning of turns before the last user turn */
    int no_bos;            /* leave out the leading BOS */
    int continue_final;    /* the last message is an assistant turn left open (no EOS) */
    duet_chat_effort_t effort;
    duet_chat_effort_profile_t effort_profile;
    duet_chat_task_t task;
    /* Written into the first system message as a "## Response Format"
     * section (any JSON value; NULL, null, {}, [], "", 0 and false mean none). */
    const json_t *response_format;
} duet_chat_opts_t;

/* Encode a conversation.
 *
 * `messages` is an OpenAI `messages` array: objects with `role` system,
 * developer, user, assistant, tool or latest_reminder; `content` a string,
 * null, or a list of {"type": "text", "text": ...} parts; assistant
 * `reasoning_content` and `tool_calls` ([{id, type: "function", function:
 * {name, arguments}}], arguments a JSON text of an object, or an object);
 * tool `tool_call_id`.  Other members are ignored.  `tools` is the OpenAI
 * `tools` array ([{type: "function", function: {name, description,
 * parameters, ...}}]) or NULL; each function object is written as given.
 * `opts` may be NULL for the defaults.
 *
 * On success `*out` is a malloc'd NUL-terminated UTF-8 prompt (free() it)
 * and `*out_len` its length in bytes (it may hold U+0000 from the input).
 * Malformed input gives DUET_ERR_INVALID (wrong type, unknown role, a tool
 * message with no call before it, ...) or DUET_ERR_PARSE (tool-call
 * arguments that are not JSON) with a sentence naming the message index and
 * field ("messages[2].tool_calls[0].function.arguments: ..."); out-of-memory
 * gives DUET_ERR_NOMEM.  Outputs are written only on success. */
duet_status_t duet_chat_encode(const json_t *messages, const json_t *tools,
                               const duet_chat_opts_t *opts, char **out, size_t *out_len,
                               duet_err_t *err);

/* "low", "high", "max" (NULL gives DEFAULT); DUET_ERR_INVALID otherwise. */
duet_status_t duet_chat_effort_parse(const char *s, duet_chat_effort_t *out, duet_err_t *err);
/* "action", "query", "authority", "domain", "title", "read_url";
 * DUET_ERR_INVALID otherwise. */
duet_status_t duet_chat_task_parse(const char *s, duet_chat_task_t *out, duet_err_t *err);

#endif
