/* fuzz_chat.c - libFuzzer target: a generic build's chat data (runtime/chat_template.c) from an
 * arbitrary tokenizer_config.json, with the text after "\n@@\n" as generation_config.json (absent
 * when there is none), against the tiny test tokenizer and a table of two known templates. */
#include "chat_template.h"
#include "fuzz_common.h"

static const chat_known_template KNOWN[] = {
    {"chatml", "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}", 1, 0, "",
     "", "<|im_start|>system\n", "<|im_end|>\n", "", "<|im_start|>user\n", "<|im_end|>\n", "<|im_start|>assistant\n",
     "<|im_end|>\n"},
    {"bos", "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}", 0, 0,
     "bos_token eos_token", "@@BOS_TOKEN@@", "", "", "", "[INST] ", " [/INST]", "", "@@EOS_TOKEN@@"},
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static tokenizer *tok;
    if (!tok && tok_load(&tok, FUZZ_TOKENIZER_JSON, 1 << 16)) abort();
    size_t first, rest_size;
    const uint8_t *rest;
    fuzz_split(data, size, &first, &rest, &rest_size);
    fuzz_write("tokenizer_config.json", data, first);
    char gen[256];
    snprintf(gen, sizeof gen, "%s/generation_config.json", fuzz_dir());
    if (rest_size) fuzz_write("generation_config.json", rest, rest_size);
    else unlink(gen);
    static const int eos[] = {2};
    chat_strings c;
    err_code rc = chat_strings_load(&c, fuzz_dir(), tok, eos, 1, KNOWN, 2);
    if (rc) {
        fuzz_check_detail(err_detail());
        return 0;
    }
    for (int i = 0; i < c.n_stop; i++)
        if (c.stop_ids[i] < 0 || c.stop_ids[i] >= tok_vocab_size(tok)) abort();
    if (c.available && (!c.bos || !c.user_prefix || !c.assistant_suffix)) abort();
    chat_strings_free(&c);
    return 0;
}
