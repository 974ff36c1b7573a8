/* chat_template.c - a generic build's chat strings from its table of known templates (see
 * chat_template.h); each step mirrors codegen/chat.py's load_chat_strings. */
#include "chat_template.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

/* The placeholders of the generated table and the tokenizer_config.json keys that fill them
 * (codegen/chat.py TOKEN_PLACEHOLDERS). */
static const char *const TOKEN_KEYS[] = {"bos_token", "eos_token", "unk_token", "pad_token"};
static const char *const PLACEHOLDERS[] = {"@@BOS_TOKEN@@", "@@EOS_TOKEN@@", "@@UNK_TOKEN@@", "@@PAD_TOKEN@@"};
#define N_TOKENS 4

/* dir/name parsed into *doc; *found = 0 (and ERR_OK) when the file does not exist. Other failures
 * name the file, as chat.py's "unreadable". */
static err_code load_optional(const char *dir, const char *name, json_doc *doc, int *found) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    err_code rc = json_parse_file(path, doc);
    *found = rc == ERR_OK;
    if (rc == ERR_IO && errno == ENOENT) return ERR_OK;
    if (!rc && doc->root->type != JSON_OBJECT) {
        json_free(doc);
        *found = 0;
        return err_set(ERR_CONFIG, "%s: expected a JSON object", path);
    }
    return rc == ERR_JSON ? ERR_CONFIG : rc; /* the detail names the file and the byte */
}

/* A special token of tokenizer_config.json: a string, or an AddedToken object's "content". */
static const json_value *token_content(const json_value *v) {
    if (v && v->type == JSON_OBJECT) v = json_get(v, "content");
    return v && v->type == JSON_STRING ? v : NULL;
}

/* s with every placeholder replaced by its token's text ("" for an absent token): malloc'd. */
static char *paste(const char *s, const json_value *const tokens[N_TOKENS]) {
    size_t cap = strlen(s) + 1;
    for (int k = 0; k < N_TOKENS; k++)
        for (const char *p = strstr(s, PLACEHOLDERS[k]); p; p = strstr(p + 1, PLACEHOLDERS[k]))
            cap += tokens[k] ? (size_t)tokens[k]->n : 0;
    char *out = malloc(cap), *o = out;
    if (!out) return NULL;
    while (*s) {
        int k = 0;
        while (k < N_TOKENS && strncmp(s, PLACEHOLDERS[k], strlen(PLACEHOLDERS[k])) != 0) k++;
        if (k < N_TOKENS) {
            if (tokens[k]) { memcpy(o, tokens[k]->str, (size_t)tokens[k]->n); o += tokens[k]->n; }
            s += strlen(PLACEHOLDERS[k]);
        } else {
            *o++ = *s++;
        }
    }
    *o = '\0';
    return out;
}

/* Adds the ids of an eos_token_id value (an id or a list of them) to ids, once each; what is not an
 * id (not an integer in 0..INT_MAX) is skipped, as codegen/chat.py skips it. */
static void add_ids(int *ids, int *n, const json_value *v) {
    const json_value *e = v && v->type == JSON_ARRAY ? v->child : v;
    for (; e; e = v->type == JSON_ARRAY ? e->next : NULL) {
        if (!json_is_int(e) || e->num < 0 || e->num > 2147483647.0) continue;
        int id = (int)e->num, seen = 0;
        for (int i = 0; i < *n; i++) seen |= ids[i] == id;
        if (!seen) ids[(*n)++] = id;
    }
}

static int cmp_int(const void *a, const void *b) { return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b); }

/* The stop ids: config.json's and generation_config.json's eos ids, and the added token the
 * assistant suffix starts with (after whitespace), longest first; ascending, each an added token. */
static err_code stop_ids(chat_strings *c, const char *dir, const tokenizer *tok, const int *eos_ids, int n_eos,
                         const char *assistant_suffix) {
    json_doc gen;
    int found;
    err_code rc = load_optional(dir, "generation_config.json", &gen, &found);
    if (rc) return rc;
    const json_value *gen_eos = found ? json_get(gen.root, "eos_token_id") : NULL;
    int cap = n_eos + 1 + (gen_eos && gen_eos->type == JSON_ARRAY ? gen_eos->n : 1);
    c->stop_ids = malloc((size_t)cap * sizeof *c->stop_ids);
    if (!c->stop_ids) { if (found) json_free(&gen); return err_set(ERR_NOMEM, "stop ids"); }
    c->n_stop = 0;
    for (int i = 0; i < n_eos; i++) {
        json_value v = {.type = JSON_NUMBER, .num = eos_ids[i], .n = 1};
        add_ids(c->stop_ids, &c->n_stop, &v);
    }
    if (gen_eos) add_ids(c->stop_ids, &c->n_stop, gen_eos);
    if (found) json_free(&gen);
    if (assistant_suffix) {
        while (isspace((unsigned char)*assistant_suffix)) assistant_suffix++;
        for (size_t n = strlen(assistant_suffix); n > 0; n--) {
            int id = tok_find_added(tok, assistant_suffix, n);
            if (id >= 0) {
                json_value v = {.type = JSON_NUMBER, .num = id, .n = 1};
                add_ids(c->stop_ids, &c->n_stop, &v);
                break;
            }
        }
    }
    qsort(c->stop_ids, (size_t)c->n_stop, sizeof *c->stop_ids, cmp_int);
    for (int i = 0; i < c->n_stop; i++)
        if (!tok_is_added(tok, c->stop_ids[i]))
            return err_set(ERR_TOKENIZER, "%s: stop token id %d is not an added token of the tokenizer", dir, c->stop_ids[i]);
    return ERR_OK;
}

err_code chat_strings_load(chat_strings *c, const char *model_dir, const tokenizer *tok, const int *eos_ids, int n_eos,
                           const chat_known_template *known, int n_known) {
    memset(c, 0, sizeof *c);
    snprintf(c->refusal, sizeof c->refusal, "has no chat template (tokenizer_config.json has no chat_template)");
    json_doc doc;
    int found;
    err_code rc = load_optional(model_dir, "tokenizer_config.json", &doc, &found);
    if (rc || !found) return rc;
    const json_value *tmpl = json_get(doc.root, "chat_template");
    if (tmpl && tmpl->type == JSON_ARRAY) { /* [{name, template}]: transformers uses "default" */
        const json_value *named = NULL;
        json_for_each(t, tmpl) {
            const json_value *name = json_get(t, "name");
            if (name && name->type == JSON_STRING && strcmp(name->str, "default") == 0) named = json_get(t, "template");
        }
        tmpl = named;
    }
    if (!tmpl || tmpl->type != JSON_STRING || tmpl->n == 0) { json_free(&doc); return ERR_OK; }

    const chat_known_template *k = NULL;
    for (int i = 0; i < n_known && !k; i++)
        if (strlen(known[i].text) == (size_t)tmpl->n && memcmp(known[i].text, tmpl->str, (size_t)tmpl->n) == 0) k = &known[i];
    const json_value *tokens[N_TOKENS];
    for (int t = 0; t < N_TOKENS; t++) tokens[t] = token_content(json_get(doc.root, TOKEN_KEYS[t]));
    if (!k) {
        snprintf(c->refusal, sizeof c->refusal,
                 "has a chat template this generic build does not know; chat with the model's own build (make MODEL=%s)", model_dir);
        rc = stop_ids(c, model_dir, tok, eos_ids, n_eos, NULL);
        json_free(&doc);
        if (rc) chat_strings_free(c);
        return rc;
    }
    for (int t = 0; t < N_TOKENS; t++) {
        const char *r = strstr(k->required, TOKEN_KEYS[t]);
        if (r && !tokens[t]) {
            snprintf(c->refusal, sizeof c->refusal, "has a chat template that needs %s, which tokenizer_config.json does not give",
                     TOKEN_KEYS[t]);
            rc = stop_ids(c, model_dir, tok, eos_ids, n_eos, NULL);
            json_free(&doc);
            if (rc) chat_strings_free(c);
            return rc;
        }
    }
    c->has_system = k->has_system;
    c->system_in_first_user = k->system_in_first_user;
    const char *const from[] = {k->bos, k->system_prefix, k->system_suffix, k->no_system_prefix, k->user_prefix,
                                k->user_suffix, k->assistant_prefix, k->assistant_suffix};
    char **const to[] = {&c->bos, &c->system_prefix, &c->system_suffix, &c->no_system_prefix, &c->user_prefix,
                         &c->user_suffix, &c->assistant_prefix, &c->assistant_suffix};
    for (size_t i = 0; i < sizeof from / sizeof *from; i++)
        if (!(*to[i] = paste(from[i], tokens))) rc = err_set(ERR_NOMEM, "chat strings");
    json_free(&doc);
    if (!rc) rc = stop_ids(c, model_dir, tok, eos_ids, n_eos, c->assistant_suffix);
    if (rc) { chat_strings_free(c); return rc; }
    c->available = 1;
    c->refusal[0] = '\0';
    return ERR_OK;
}

void chat_strings_free(chat_strings *c) {
    char *strings[] = {c->bos, c->system_prefix, c->system_suffix, c->no_system_prefix, c->user_prefix, c->user_suffix,
                       c->assistant_prefix, c->assistant_suffix};
    for (size_t i = 0; i < sizeof strings / sizeof *strings; i++) free(strings[i]);
    free(c->stop_ids);
    memset(c, 0, sizeof *c);
}
