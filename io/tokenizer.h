/*
** tokenizer.h -- byte-pair-encoding tokenizers as language models ship
** them, read from their files and giving the ids Hugging Face's
** `tokenizers` gives:
**   - GPT-2's pair vocab.json + merges.txt (byte-level BPE, its regex);
**   - tokenizer.json, the `tokenizers` library's own format: a BPE model
**     (byte_fallback, unk, ignore_merges), normalizers NFC/NFKC, Prepend,
**     Replace and Sequence; pre-tokenizers ByteLevel, Split (a regex or a
**     string; isolated or removed), Metaspace and Sequence; added and
**     special tokens (lstrip, rstrip); the template post-processor; the
**     ByteLevel, Metaspace, Replace, ByteFallback, Fuse and Strip decoders.
** Regexes run on PCRE2 (the exporters' patterns use Unicode classes);
** Unicode normalization is libunistring's.  Anything else in a file is
** refused with FL_EUNSUPPORTED naming the field, and a malformed file is
** FL_EFORMAT naming the file and the field: nothing is half loaded.
*/
#ifndef FL_TOKENIZER_H
#define FL_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "graph/err.h"

typedef struct tok_tokenizer tok_tokenizer;

/* The largest vocabulary accepted (ids 0 .. TOK_MAX_VOCAB - 1). */
#define TOK_MAX_VOCAB (1 << 22)

/* GPT-2's two files.  config_path (may be NULL) is a tokenizer_config.json
** whose "added_tokens_decoder" names the special tokens; without one,
** "<|endoftext|>" is special when the vocabulary has it, as GPT-2's. */
int tok_load_bpe(const char *vocab_path, const char *merges_path, const char *config_path,
                 tok_tokenizer **out, fl_err *e);

/* A tokenizer.json file. */
int tok_load_json(const char *path, tok_tokenizer **out, fl_err *e);
/* The same from n bytes of its text; path names it in messages. */
int tok_parse_json(const char *text, size_t n, const char *path, tok_tokenizer **out, fl_err *e);

void tok_free(tok_tokenizer *t);

/* The ids of n bytes of UTF-8 text (invalid UTF-8 is FL_EINVAL naming the
** byte), the post-processor's special tokens added when add_special.  *ids
** is malloc'ed (free it). */
int tok_encode(const tok_tokenizer *t, const char *s, size_t n, int add_special,
               int64_t **ids, size_t *nids, fl_err *e);

/* The text of n ids (an id outside the vocabulary is FL_EINVAL naming it),
** special tokens left out when skip_special.  *s is malloc'ed and
** NUL-terminated (free it); bytes that do not form UTF-8 become U+FFFD. */
int tok_decode(const tok_tokenizer *t, const int64_t *ids, size_t n, int skip_special,
               char **s, size_t *len, fl_err *e);

/* Vocabulary size (the largest id + 1, added tokens included). */
int64_t tok_vocab_size(const tok_tokenizer *t);
/* A token's string as the vocabulary spells it, NULL for an unused id. */
const char *tok_id_to_token(const tok_tokenizer *t, int64_t id);
/* A token's id, -1 when absent. */
int64_t tok_token_to_id(const tok_tokenizer *t, const char *s, size_t n);
/* Whether id is a special token. */
int tok_is_special(const tok_tokenizer *t, int64_t id);
/* "byte-level BPE, 50257 tokens, 50000 merges" and such, for printing. */
const char *tok_describe(const tok_tokenizer *t);

#endif
