/* chat_template.h - the chat strings of a generic build, found at run time.
 *
 * A specialized build renders its model's Jinja chat template at build time into fixed strings
 * (codegen/chat.py -> model_chat.h). A generic binary cannot run Jinja, so its generator renders a
 * table of the templates it knows instead, with placeholders where a template writes a special
 * token; when a model directory is opened, chat_strings_load finds the model's chat_template in
 * that table, byte for byte, and pastes in the model's special tokens from tokenizer_config.json.
 * The stop tokens are found as codegen/chat.py finds them: the eos ids of config.json and
 * generation_config.json, and the added token that ends an assistant turn. A template not in the
 * table makes --chat refuse, saying so; completion does not need it. */
#ifndef INGOT_CHAT_TEMPLATE_H
#define INGOT_CHAT_TEMPLATE_H

#include "errors.h"
#include "tokenizer.h"

/* One entry of the generated table (model_chat.h of a generic build). */
typedef struct {
    const char *source;            /* where the generator read it */
    const char *text;              /* the chat_template, exactly */
    int has_system;                /* the template has a system role */
    int system_in_first_user;      /* the system block sits inside the first user turn */
    const char *required;          /* special tokens it cannot render without, space-separated */
    const char *bos, *system_prefix, *system_suffix, *no_system_prefix, *user_prefix, *user_suffix,
        *assistant_prefix, *assistant_suffix; /* with placeholders: @@BOS_TOKEN@@, @@EOS_TOKEN@@, ... */
} chat_known_template;

/* A model's chat strings, as the MODEL_CHAT_* names of model_chat.h read them. */
typedef struct {
    int available;       /* --chat works */
    char refusal[256];   /* else why not, following the model's name: "has no chat template (...)" */
    int has_system, system_in_first_user;
    char *bos, *system_prefix, *system_suffix, *no_system_prefix, *user_prefix, *user_suffix, *assistant_prefix,
        *assistant_suffix;
    int n_stop;
    int *stop_ids;       /* (n_stop) ascending: tokens that end the assistant's turn */
} chat_strings;

/* Fills *c for the model in model_dir, whose config.json gave eos_ids[0..n_eos): the entry of
 * known[0..n_known) whose text is the model's chat_template, its placeholders replaced by the
 * model's tokens, and the stop ids (tok resolves them). A model without a chat template, or with
 * one not in the table, gets available = 0 and the reason. Errors, as the generator's: an
 * unreadable tokenizer_config.json or generation_config.json, a stop id that is no added token. */
err_code chat_strings_load(chat_strings *c, const char *model_dir, const tokenizer *tok, const int *eos_ids, int n_eos,
                           const chat_known_template *known, int n_known);

void chat_strings_free(chat_strings *c);

#endif
