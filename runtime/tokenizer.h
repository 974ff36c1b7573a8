/* tokenizer.h - exact Hugging Face `tokenizers` encoding and decoding from tokenizer.json.
 *
 * Supported: BPE models with the byte-level pre-tokenizer (GPT-2, SmolLM2 with its digit split,
 * Llama-3 and Qwen2 split patterns) and SentencePiece-style BPE (Metaspace or the Replace+Prepend
 * normalizer, byte fallback) as used by Llama-2, Mistral and TinyLlama; the NFC normalizer (Qwen2);
 * added and special tokens (lstrip / rstrip / normalized); the TemplateProcessing, Bert, Roberta
 * and ByteLevel post-processors for the special tokens added to a single sequence. Anything else
 * in tokenizer.json (another regex, model type, normalizer, single_word tokens, truncation,
 * padding...) is refused with ERR_TOKENIZER naming the JSON key and value. Encoding gives the same
 * ids as `Tokenizer.encode(text).ids` in the Python library (tokenizers 0.23). */
#ifndef INGOT_TOKENIZER_H
#define INGOT_TOKENIZER_H

#include <stddef.h>

#include "errors.h"

typedef struct tokenizer tokenizer;

/* Loads tokenizer.json. Every id it holds (vocab, added tokens, post-processor) must be below
 * max_ids, the model's vocab_size: an id the logits do not have is refused here, before anything
 * is allocated for it, naming the id; the post-processor's ids must also be tokens. */
err_code tok_load(tokenizer **out, const char *tokenizer_json_path, int max_ids);
void tok_free(tokenizer *t);

int tok_vocab_size(const tokenizer *t); /* largest id + 1, added tokens included */

/* Encodes text[0..len) (must be valid UTF-8, else ERR_UTF8 naming the byte offset). With
 * add_special, the post-processor's special tokens are added (e.g. BOS for Llama), as
 * encode(text, add_special_tokens=True) does. Special tokens written in the text ("<|im_start|>")
 * are matched as tokens, as the library does. *ids is malloc'd; the caller frees it. */
err_code tok_encode(const tokenizer *t, const char *text, size_t len, int add_special, int **ids, int *n_ids);

/* tok_encode where only the text marked in control (one flag a byte, nonzero: control text)
 * may hold special tokens: the special tokens' text in unmarked bytes is tokenized as the plain
 * text it is, as the library does with split_special_tokens=True, so text from a user cannot
 * forge a chat template's control tokens. Added tokens that are not special match everywhere.
 * control NULL marks every byte (tok_encode). */
err_code tok_encode_marked(const tokenizer *t, const char *text, size_t len, const unsigned char *control,
                           int add_special, int **ids, int *n_ids);

/* The bytes that token id contributes to the decoded text, given the previous token (prev < 0 at
 * the start of the text: SentencePiece-style decoders drop the leading space there). The bytes may
 * be part of a UTF-8 character; concatenating the pieces of a sequence gives
 * decode(ids, skip_special_tokens=False) whenever that is valid UTF-8 (the library turns invalid
 * bytes into U+FFFD; pieces stay raw bytes). Returns the number of bytes written to buf, or -1 for
 * an id out of range or a cap below the piece's length: cap >= tok_max_piece_bytes(t) is always
 * enough. An id inside the range that no token has gives 0 bytes, as the library skips it. */
int tok_decode_piece(const tokenizer *t, int prev, int id, char *buf, size_t cap);

/* The longest piece tok_decode_piece can write for this tokenizer, in bytes. */
int tok_max_piece_bytes(const tokenizer *t);

/* Id of the token whose content is exactly str (vocab or added tokens), or -1. */
int tok_find(const tokenizer *t, const char *str);

/* Id of the added token (tokenizer.json's added_tokens) whose content is exactly s[0..n), or -1. */
int tok_find_added(const tokenizer *t, const char *s, size_t n);

/* Whether id is an added token's. */
int tok_is_added(const tokenizer *t, int id);

#endif
