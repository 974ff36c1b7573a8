/* main.c - ingot's command line: completion, chat, perplexity, tokenize and bench for the one model
 * this binary was generated for, or, in the generic build, for the model directory given with -m.
 *
 * Compiled once per model against generated/<model>/ (model_config.h, model_chat.h), or once
 * against generated/generic/, where the MODEL_* values are read from the model's config.json
 * before the flags that depend on them are checked. Everything the user can get wrong is checked
 * before the first token: flags, the model directory's config.json against the built-in one (or
 * against what the generic build supports), every weight's name, dtype and shape, the tokenizer,
 * the prompt's UTF-8 and its length against the context. Errors end in one line on stderr and
 * exit 1. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bundle.h"
#include "engine.h"
#include "json.h"
#include "model.h"
#include "model_spec.h"
#ifdef INGOT_CUDA
#include "probe_cuda.h"
#endif
#include "model_chat.h"
#include "probe.h"
#include "quality.h"
#include "sampler.h"
#include "server.h"
#include "tokenizer.h"

#ifndef INGOT_MODEL_DIR
#error "INGOT_MODEL_DIR (the model directory this binary was built from) must be defined by the build"
#endif

// ----------------------------------------------------------------------------------------------
// Options

typedef struct {
    const char *model_dir;
    const char *prompt;       /* -p */
    const char *prompt_file;  /* -f */
    int n_tokens;             /* -n: tokens to generate, -1: until end of turn or context */
    sampler_config sampling;
    int seed_given;
    int chat;
    const char *system;
    const char *perplexity_file;
    const char *kl_base;      /* --perplexity: write the base model's log-probabilities here */
    const char *kl;           /* --perplexity: compare against the base file written by --kl-base */
    int bench;
    const char *bench_depths; /* comma-separated context depths, tokens */
    int bench_prompt;         /* prompt tokens --bench times */
    int json;
    int bench_kernels;
    int tokenize;
    int n_threads;
    int ctx;
    const char *top_k_arg;    /* --top-k and --ctx, checked against the model once it is known */
    const char *ctx_arg;
    const char *device;
    const char *dump_logits;  /* testing aid: the prompt's logits, float32 (n_tokens, vocab) */
    int dump_prefill;         /* ... its first N tokens fed at once (the prompt path), logits from position N - 1 on */
    int parse_special;        /* --chat: special-token text in a message is the control token */
    int serve;                /* --serve: the HTTP server (server.h) */
    server_config server;
    int model_given;          /* -m: not the executable's own model (an appliance's) */
    int check_weights;        /* scan the weights for NaN and infinity at load */
    int kv_cache;             /* --kv-cache: a kv_cache_type (model.h) */
    int exact_prompt;         /* --exact-prompt: on the GPU, a prompt a step a token */
} options;

static void usage(FILE *f) {
    char built_for[512], ctx_default[64];
    if (MODEL_GENERIC) {
        snprintf(built_for, sizeof built_for, "generic build: any supported model directory");
        snprintf(ctx_default, sizeof ctx_default, "the model's");
    } else {
        snprintf(built_for, sizeof built_for, "built for %s, %s", MODEL_NAME, MODEL_ARCHITECTURE);
        snprintf(ctx_default, sizeof ctx_default, "%d, the model's", MODEL_SEQ_LEN);
    }
    fprintf(f,
            "usage: ingot [options]   (%s)\n"
            "\n"
            "  -p, --prompt TEXT       complete TEXT (or, with --chat, answer it as one user turn)\n"
            "  -f, --file FILE         read the prompt from FILE (default: stdin when it is not a terminal)\n"
            "  -n, --n-tokens N        tokens to generate (default 256; chat: until the end of the turn, at most 1024)\n"
            "      --chat              chat with the model's own template; interactive without -p\n"
            "      --system TEXT       system prompt for --chat\n"
            "      --temp T            temperature, 0 = greedy (default 0.7)\n"
            "      --top-k K           keep the K most likely tokens, 0 = off (default 40)\n"
            "      --top-p P           nucleus sampling, 1 = off (default 0.95)\n"
            "      --min-p P           drop tokens below P x the top probability, 0 = off (default 0.05)\n"
            "      --repeat-penalty R  penalise the last 64 tokens, 1 = off (default 1.0)\n"
            "      --seed S            random seed; the same seed gives the same text (default: time)\n"
            "      --perplexity FILE   perplexity of the model on FILE, as llama.cpp computes it: chunks of --ctx\n"
            "                          tokens (default 512), the second half of each scored\n"
            "      --kl-base OUT       --perplexity: also write the log-probabilities of the scored tokens to OUT,\n"
            "                          the base that --kl compares another build of the model against\n"
            "      --kl BASE           --perplexity: KL divergence, top-1 agreement and perplexity ratio against BASE\n"
            "      --bench             prompt and decode speed, GB/s and share of measured read bandwidth, the\n"
            "                          prompt's TFLOP/s (on the CPU also its share of a measured FMA rate)\n"
            "      --bench-depths LIST context depths for --bench decode and prompt (default: cpu 0, cuda 0,4096,16384,32768)\n"
            "      --bench-prompt N    --bench: prompt tokens timed, median of 3 passes (default 128)\n"
            "      --json              --bench: print one JSON object\n"
            "      --bench-kernels     --bench: also time each stage of the decode step and of a prompt batch\n"
            "                          (on the GPU, of each prompt batch size) at each depth\n"
            "      --tokenize          print the prompt's token ids (with --chat: its chat turn's) and exit\n"
            "  -m, --model DIR         model directory (default %s)\n"
            "      --check-weights     refuse weights that hold NaN or infinity (a scan of every weight at load)\n"
            "      --threads N         CPU threads (default: physical cores)\n"
            "      --ctx N             context length in tokens (default %s; --perplexity: 512)\n"
            "      --kv-cache f16|q8   the KV cache's elements: fp16, or int8 with a scale a position and KV head\n"
            "                          (half the bytes: longer contexts, faster deep decode; default f16)\n"
            "      --exact-prompt      on the GPU, feed a prompt a token at a time through the decode step (fp32\n"
            "                          inputs, as the CPU computes it) instead of in tensor-core batches (bf16\n"
            "                          inputs): the GPU's text is then the CPU's; prompts are many times slower\n"
            "      --device cpu|cuda   where to run (default: cuda when this build and machine have it)\n"
            "      --dump-logits FILE  write the prompt's logits as float32 (n_tokens, vocab) and exit;\n"
            "                          with --perplexity, those of the scored tokens\n"
            "      --dump-prefill N    ... its first N tokens fed at once (the prompt path), then one at a\n"
            "                          time: the logits of positions N - 1 on (n_tokens - N + 1 rows)\n"
            "      --parse-special     --chat: special-token text in a message (\"<|im_end|>\") is that control token,\n"
            "                          as Hugging Face's default does (default: plain text)\n"
            "      --serve             serve the OpenAI API and a chat page over HTTP (see README)\n"
            "      --host ADDR         --serve: the address to listen on (default 127.0.0.1)\n"
            "      --port N            --serve: the port (default 8080; 0: any free one, printed)\n"
            "      --queue N           --serve: requests waiting for the model at most; more get 503 (default 16)\n"
            "      --timeout S         --serve: close a connection that sends or takes nothing for S seconds (default 30)\n"
            "      --no-prompt-cache   --serve: feed every prompt whole, not reusing the previous request's cache\n"
            "  -h, --help              this text\n",
            built_for, INGOT_MODEL_DIR, ctx_default);
}

static err_code parse_long(const char *flag, const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || !*s || *end || errno || v < lo || v > hi)
        return err_set(ERR_ARG, "%s %s: expected an integer in %ld..%ld", flag, s ? s : "(missing)", lo, hi);
    *out = v;
    return ERR_OK;
}

static err_code parse_float(const char *flag, const char *s, float lo, float hi, float *out) {
    char *end;
    errno = 0;
    float v = s ? strtof(s, &end) : 0.0f;
    if (!s || !*s || *end || errno || !(v >= lo && v <= hi))
        return err_set(ERR_ARG, "%s %s: expected a number in %g..%g", flag, s ? s : "(missing)", lo, hi);
    *out = v;
    return ERR_OK;
}

/* Physical cores: one thread per core is what a bandwidth-bound loop wants. */
static int physical_cores(void) {
    int n = (int)sysconf(_SC_NPROCESSORS_ONLN), cores = 0;
    char seen[4096] = {0};
    for (int c = 0; c < n; c++) {
        char path[128];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/thread_siblings_list", c);
        FILE *f = fopen(path, "r");
        int first;
        if (!f) return n > 0 ? n : 1;
        int ok = fscanf(f, "%d", &first) == 1;
        fclose(f);
        if (!ok || first < 0 || first >= (int)sizeof seen) return n > 0 ? n : 1;
        if (!seen[first]) { seen[first] = 1; cores++; }
    }
    return cores > 0 ? cores : 1;
}

static err_code parse_args(int argc, char **argv, options *o) {
    *o = (options){
        .model_dir = INGOT_MODEL_DIR,
        .n_tokens = -1,
        .sampling = {.temperature = 0.7f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f,
                     .repeat_penalty = 1.0f, .repeat_last_n = 64},
        .n_threads = physical_cores(),
        .server = {.host = "127.0.0.1", .port = 8080, .queue = 16, .prompt_cache = 1, .timeout_s = 30},
    };
    const char *server_flag = NULL; /* the last flag only --serve takes */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long n;
        err_code rc = ERR_OK;
#define FLAG(s, l) (strcmp(a, s) == 0 || strcmp(a, l) == 0)
#define NEEDS_VALUE() \
    do { if (!v) return err_set(ERR_ARG, "%s needs a value", a); i++; } while (0)
        if (FLAG("-h", "--help")) { usage(stdout); exit(0); }
        else if (FLAG("-p", "--prompt")) { NEEDS_VALUE(); o->prompt = v; }
        else if (FLAG("-f", "--file")) { NEEDS_VALUE(); o->prompt_file = v; }
        else if (FLAG("-m", "--model")) {
            NEEDS_VALUE();
            /* its files' paths are built in 4096-byte buffers: a longer one would be cut, not refused */
            if (strlen(v) > 3072) return err_set(ERR_ARG, "%s: a path of %zu bytes, at most 3072", a, strlen(v));
            o->model_dir = v;
            o->model_given = 1;
        }
        else if (FLAG("-n", "--n-tokens")) { NEEDS_VALUE(); rc = parse_long(a, v, 0, INT_MAX, &n); o->n_tokens = (int)n; }
        else if (FLAG("--temp", "--temperature")) { NEEDS_VALUE(); rc = parse_float(a, v, 0.0f, 100.0f, &o->sampling.temperature); }
        else if (FLAG("--top-k", "--top-k")) { NEEDS_VALUE(); o->top_k_arg = v; }
        else if (FLAG("--top-p", "--top-p")) { NEEDS_VALUE(); rc = parse_float(a, v, 0.0f, 1.0f, &o->sampling.top_p); }
        else if (FLAG("--min-p", "--min-p")) { NEEDS_VALUE(); rc = parse_float(a, v, 0.0f, 1.0f, &o->sampling.min_p); }
        else if (FLAG("--repeat-penalty", "--repeat-penalty")) { NEEDS_VALUE(); rc = parse_float(a, v, 0.01f, 100.0f, &o->sampling.repeat_penalty); }
        else if (FLAG("--seed", "--seed")) {
            NEEDS_VALUE();
            char *end;
            errno = 0;
            unsigned long long s = strtoull(v, &end, 10);
            if (!*v || *end || errno || *v == '-') return err_set(ERR_ARG, "--seed %s: expected a non-negative integer", v);
            o->sampling.seed = s;
            o->seed_given = 1;
        }
        else if (FLAG("--chat", "--chat")) o->chat = 1;
        else if (FLAG("--system", "--system")) { NEEDS_VALUE(); o->system = v; }
        else if (FLAG("--perplexity", "--perplexity")) { NEEDS_VALUE(); o->perplexity_file = v; }
        else if (FLAG("--kl-base", "--kl-base")) { NEEDS_VALUE(); o->kl_base = v; }
        else if (FLAG("--kl", "--kl")) { NEEDS_VALUE(); o->kl = v; }
        else if (FLAG("--bench", "--bench")) o->bench = 1;
        else if (FLAG("--bench-depths", "--bench-depths")) { NEEDS_VALUE(); o->bench_depths = v; }
        else if (FLAG("--bench-prompt", "--bench-prompt")) { NEEDS_VALUE(); rc = parse_long(a, v, 1, INT_MAX, &n); o->bench_prompt = (int)n; }
        else if (FLAG("--json", "--json")) o->json = 1;
        else if (FLAG("--bench-kernels", "--bench-kernels")) o->bench_kernels = 1;
        else if (FLAG("--tokenize", "--tokenize")) o->tokenize = 1;
        else if (FLAG("--check-weights", "--check-weights")) o->check_weights = 1;
        else if (FLAG("--threads", "--threads")) { NEEDS_VALUE(); rc = parse_long(a, v, 1, 1024, &n); o->n_threads = (int)n; }
        else if (FLAG("--ctx", "--ctx")) { NEEDS_VALUE(); o->ctx_arg = v; }
        else if (FLAG("--kv-cache", "--kv-cache")) {
            NEEDS_VALUE();
            if (strcmp(v, "f16") == 0) o->kv_cache = KV_F16;
            else if (strcmp(v, "q8") == 0) o->kv_cache = KV_Q8;
            else return err_set(ERR_ARG, "--kv-cache %s: expected f16 or q8", v);
        }
        else if (FLAG("--exact-prompt", "--exact-prompt")) o->exact_prompt = 1;
        else if (FLAG("--device", "--device")) {
            NEEDS_VALUE();
            if (strcmp(v, "cpu") != 0 && strcmp(v, "cuda") != 0) return err_set(ERR_ARG, "--device %s: expected cpu or cuda", v);
            o->device = v;
        }
        else if (FLAG("--dump-logits", "--dump-logits")) { NEEDS_VALUE(); o->dump_logits = v; }
        else if (FLAG("--dump-prefill", "--dump-prefill")) { NEEDS_VALUE(); rc = parse_long(a, v, 1, INT_MAX, &n); o->dump_prefill = (int)n; }
        else if (FLAG("--parse-special", "--parse-special")) o->parse_special = 1;
        else if (FLAG("--serve", "--serve")) o->serve = 1;
        else if (FLAG("--host", "--host")) { NEEDS_VALUE(); server_flag = a; o->server.host = v; }
        else if (FLAG("--port", "--port")) { NEEDS_VALUE(); server_flag = a; rc = parse_long(a, v, 0, 65535, &n); o->server.port = (int)n; }
        else if (FLAG("--queue", "--queue")) { NEEDS_VALUE(); server_flag = a; rc = parse_long(a, v, 0, 4096, &n); o->server.queue = (int)n; }
        else if (FLAG("--timeout", "--timeout")) { NEEDS_VALUE(); server_flag = a; rc = parse_long(a, v, 1, 86400, &n); o->server.timeout_s = (int)n; }
        else if (FLAG("--no-prompt-cache", "--no-prompt-cache")) { o->server.prompt_cache = 0; server_flag = a; }
        else return err_set(ERR_ARG, "unknown option '%s' (see --help)", a);
        if (rc) return rc;
#undef FLAG
#undef NEEDS_VALUE
    }
    if (o->prompt && o->prompt_file) return err_set(ERR_ARG, "-p and -f both given; use one");
    /* --dump-logits with --perplexity dumps the scored tokens' logits, a mode of its own otherwise */
    int modes = !!o->bench + !!o->perplexity_file + !!(o->tokenize || o->chat) + !!(o->dump_logits && !o->perplexity_file) + !!o->serve;
    if (modes > 1) return err_set(ERR_ARG, "--chat (or --tokenize), --bench, --perplexity, --dump-logits and --serve exclude each other");
    if (o->serve && (o->prompt || o->prompt_file)) return err_set(ERR_ARG, "--serve takes its prompts over HTTP, not -p or -f");
    if (o->system && !o->chat) return err_set(ERR_ARG, "--system needs --chat");
    if (o->parse_special && !o->chat) return err_set(ERR_ARG, "--parse-special needs --chat");
    if (server_flag && !o->serve) return err_set(ERR_ARG, "%s needs --serve", server_flag);
    if (o->dump_prefill && !o->dump_logits) return err_set(ERR_ARG, "--dump-prefill needs --dump-logits");
    if (o->dump_prefill && o->perplexity_file) return err_set(ERR_ARG, "--dump-prefill and --perplexity exclude each other");
    if (o->dump_prefill && o->exact_prompt) return err_set(ERR_ARG, "--dump-prefill and --exact-prompt exclude each other");
    if ((o->kl_base || o->kl) && !o->perplexity_file) return err_set(ERR_ARG, "%s needs --perplexity", o->kl ? "--kl" : "--kl-base");
    if (o->kl_base && o->kl) return err_set(ERR_ARG, "--kl-base and --kl exclude each other: write the base with one run, compare with another");
    if (o->bench_prompt && !o->bench) return err_set(ERR_ARG, "--bench-prompt needs --bench");
#ifdef INGOT_CUDA
    int gpus = cuda_device_count();
    if (!o->device) o->device = gpus > 0 ? "cuda" : "cpu";
    if (strcmp(o->device, "cuda") == 0 && gpus == 0)
        return err_set(ERR_DEVICE, "--device cuda: no CUDA device on this machine; use --device cpu");
#else
    if (!o->device) o->device = "cpu";
    if (strcmp(o->device, "cuda") == 0)
        return err_set(ERR_DEVICE, "--device cuda: this binary was built without CUDA (no nvcc at build time); use --device cpu");
#endif
    if (!o->bench_depths) o->bench_depths = strcmp(o->device, "cuda") == 0 ? "0,4096,16384,32768" : "0";
    if (!o->seed_given) o->sampling.seed = (uint64_t)(time_now() * 1e6);
    o->server.sampling = o->sampling;
    o->server.seed_given = o->seed_given;
    o->server.max_tokens = o->n_tokens;
    return ERR_OK;
}

#define PPL_CTX_DEFAULT 512

/* Bytes of KV cache a position holds, keys and values of every layer: fp16 elements, or q8's int8
 * ones and a float scale a KV head (kv_cache_type) */
static unsigned long long kv_bytes_per_pos(int kv) {
    if (kv == KV_Q8) return (unsigned long long)MODEL_N_LAYERS * 2 * (MODEL_KV_DIM + sizeof(float) * MODEL_N_KV_HEADS);
    return MODEL_KV_BYTES_PER_POS;
}

/* The flags whose ranges are the model's, checked once its dimensions are known (in a generic
 * build, after its config.json is read). */
static err_code check_model_args(options *o) {
    long n;
    err_code rc;
    /* perplexity's chunks are llama.cpp's default context, 512 tokens */
    o->ctx = o->perplexity_file && MODEL_SEQ_LEN > PPL_CTX_DEFAULT ? PPL_CTX_DEFAULT : MODEL_SEQ_LEN;
    if (o->ctx_arg) {
        if ((rc = parse_long("--ctx", o->ctx_arg, 1, MODEL_SEQ_LEN, &n))) return rc;
        o->ctx = (int)n;
    }
    if (o->top_k_arg) {
        if ((rc = parse_long("--top-k", o->top_k_arg, 0, MODEL_VOCAB_SIZE, &n))) return rc;
        o->sampling.top_k = (int)n;
    }
    return ERR_OK;
}

// ----------------------------------------------------------------------------------------------
// Files

/* The most bytes of text -f, stdin or --perplexity may give: a file or device without end (-f
 * /dev/zero) is refused at the limit instead of filling memory. Tokenizing takes about 20 bytes of
 * memory a byte of text (52 MB: 1 GB), so the limit bounds that too: 16 MiB, ~330 MB. */
#define TEXT_MAX ((size_t)16 << 20)

/* A prompt or text file, whole (a pipe or FIFO too: the user named it), at most TEXT_MAX bytes. */
static err_code read_file(const char *path, char **out, size_t *len) {
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f) return err_set(ERR_IO, "%s: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf) { if (f != stdin) fclose(f); return err_set(ERR_NOMEM, "%s: reading", path); }
    for (;;) {
        if (n == cap) {
            if (cap > TEXT_MAX) {
                free(buf);
                if (f != stdin) fclose(f);
                return err_set(ERR_IO, "%s: more than %zu bytes of text", path, TEXT_MAX);
            }
            char *nb = realloc(buf, 2 * cap + 1);
            if (!nb) { free(buf); if (f != stdin) fclose(f); return err_set(ERR_NOMEM, "%s: %zu bytes", path, 2 * cap); }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    int failed = ferror(f);
    if (f != stdin) fclose(f);
    if (failed) { free(buf); return err_set(ERR_IO, "%s: read error", path); }
    if (n > TEXT_MAX) { free(buf); return err_set(ERR_IO, "%s: more than %zu bytes of text", path, TEXT_MAX); }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return ERR_OK;
}

// ----------------------------------------------------------------------------------------------
// Modes

static err_code run_completion(engine *e, const options *o, const char *text) {
    int *ids, n;
    err_code rc = engine_encode(e, text, 1, &ids, &n);
    if (rc) return rc;
    if (n == 0) { free(ids); return err_set(ERR_ARG, "the prompt is empty"); }
    if (n >= e->ctx) {
        free(ids);
        return err_set(ERR_CONTEXT, "the prompt is %d tokens, the context %d; nothing would be left to generate (raise --ctx, at most %d)",
                       n, e->ctx, MODEL_SEQ_LEN);
    }
    sampler s;
    if ((rc = engine_sampler_init(e, &s, &o->sampling))) { free(ids); return rc; }
    rc = engine_feed(e, ids, n);
    free(ids);
    if (rc) { sampler_free(&s); return rc; }
    fputs(text, stdout);
    int full;
    rc = engine_generate(e, &s, o->n_tokens < 0 ? 256 : o->n_tokens, stdout, NULL, &full);
    sampler_free(&s);
    fputc('\n', stdout);
    if (!rc && full) fprintf(stderr, "ingot: stopped: the context of %d tokens is full (--ctx)\n", e->ctx);
    return rc;
}

/* Tokens of one answer when -n is not given: a model stuck in a loop stops here, not at the end of
 * the context. */
#define CHAT_MAX_ANSWER 1024

static err_code chat_answer(engine *e, sampler *s, const options *o, const char *system, const char *user, int first, int *full) {
    int *ids, n;
    err_code rc = engine_chat_turn(e, system, user, first, o->parse_special, &ids, &n);
    if (rc) return rc;
    rc = engine_feed(e, ids, n);
    free(ids);
    if (rc) return rc;
    rc = engine_generate(e, s, o->n_tokens < 0 ? CHAT_MAX_ANSWER : o->n_tokens, stdout, NULL, full);
    fputc('\n', stdout);
    fflush(stdout);
    return rc;
}

/* Whether the model can chat as asked. */
static err_code chat_check(const options *o) {
    if (!MODEL_CHAT_AVAILABLE) return err_set(ERR_ARG, "--chat: %s %s", MODEL_NAME, MODEL_CHAT_REFUSAL);
    if (o->system && !MODEL_CHAT_HAS_SYSTEM)
        return err_set(ERR_ARG, "--system: this model's chat template has no system role");
    return ERR_OK;
}

static err_code run_chat(engine *e, const options *o, const char *one_turn) {
    err_code rc = chat_check(o);
    if (rc) return rc;
    sampler s;
    if ((rc = engine_sampler_init(e, &s, &o->sampling))) return rc;
    int full = 0;
    if (one_turn) {
        rc = chat_answer(e, &s, o, o->system, one_turn, 1, &full);
    } else {
        int tty = isatty(STDIN_FILENO);
        char *line = NULL;
        size_t cap = 0;
        int first = 1;
        while (!rc && !full) {
            if (tty) { fputs("> ", stdout); fflush(stdout); }
            ssize_t len = getline(&line, &cap, stdin);
            if (len < 0) break;
            while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
            if (len == 0) break; /* an empty line ends the conversation, as Ctrl-D does */
            rc = chat_answer(e, &s, o, o->system, line, first, &full);
            first = 0;
        }
        free(line);
    }
    sampler_free(&s);
    if (!rc && full) fprintf(stderr, "ingot: stopped: the context of %d tokens is full (--ctx)\n", e->ctx);
    return rc;
}

/* The prompt's token ids; with --chat, those of the first chat turn that holds it (what --chat
 * feeds the model). */
static err_code run_tokenize(engine *e, const options *o, const char *text) {
    int *ids, n;
    err_code rc;
    if (o->chat) {
        if ((rc = chat_check(o))) return rc;
        rc = engine_chat_turn(e, o->system, text, 1, o->parse_special, &ids, &n);
    } else {
        rc = engine_encode(e, text, 1, &ids, &n);
    }
    if (rc) return rc;
    for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
    printf("\n");
    free(ids);
    return ERR_OK;
}

/* The prompt's logits, position by position; with prefill > 1 its first `prefill` tokens fed at
 * once (the prompt path: on the GPU its batches), then the logits of positions prefill - 1 on. */
static err_code run_dump_logits(engine *e, const char *text, const char *path, int prefill) {
    int *ids, n;
    err_code rc = engine_encode(e, text, 1, &ids, &n);
    if (rc) return rc;
    if (n > e->ctx) { free(ids); return err_set(ERR_CONTEXT, "the prompt is %d tokens, the context %d", n, e->ctx); }
    if (prefill > n) { free(ids); return err_set(ERR_ARG, "--dump-prefill %d: the prompt is %d token%s", prefill, n, n == 1 ? "" : "s"); }
    FILE *f = fopen(path, "wb");
    if (!f) { free(ids); return err_set(ERR_IO, "%s: %s", path, strerror(errno)); }
    const int first = prefill > 1 ? prefill : 1; /* tokens the first feed takes */
    for (int i = 0; i < n && !rc; i += i ? 1 : first) {
        rc = engine_feed(e, ids + i, i ? 1 : first);
        if (!rc && fwrite(e->logits, sizeof(float), (size_t)MODEL_VOCAB_SIZE, f) != (size_t)MODEL_VOCAB_SIZE) rc = err_set(ERR_IO, "%s: write failed", path);
    }
    if (fclose(f) && !rc) rc = err_set(ERR_IO, "%s: write failed", path);
    free(ids);
    return rc;
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* The fraction-quantile of n sorted values, interpolated between neighbours as llama.cpp does. */
static double percentile(const float *v, long n, double fraction) {
    double p = fraction * (n - 1);
    long i = (long)p;
    return i + 1 < n ? (1 - (p - i)) * v[i] + (p - i) * v[i + 1] : v[n - 1];
}

/* --perplexity, as llama.cpp's perplexity tool computes it (so that the figures compare with its
 * published ones): the text's tokens (with the tokenizer's own BOS, if it adds one) cut into
 * n_ctx-token chunks, a last partial chunk dropped; each chunk run from an empty cache with its
 * first token replaced by BOS where the tokenizer adds one; the tokens of its second half scored,
 * each by the logits of the position before it (n_ctx - 1 - n_ctx/2 a chunk). Prints exp(mean nll)
 * with its standard error. --kl-base writes the scored positions' log-probabilities; --kl compares
 * against them (quality.h); --dump-logits writes the scored positions' logits, float32. */
static err_code run_perplexity(engine *e, const options *o) {
    const char *path = o->perplexity_file;
    const int n_ctx = e->ctx, first = n_ctx / 2, n_score = n_ctx - 1 - first, V = MODEL_VOCAB_SIZE;
    if (n_score < 1) return err_set(ERR_ARG, "--ctx %d: perplexity scores the second half of each chunk: at least 3 tokens", n_ctx);
    char *text;
    size_t len;
    err_code rc = read_file(path, &text, &len);
    if (rc) return rc;
    int *ids, n, *bos_ids, n_bos;
    rc = tok_encode(e->tok, text, len, 1, &ids, &n);
    free(text);
    if (rc) return rc;
    if ((rc = tok_encode(e->tok, "", 0, 1, &bos_ids, &n_bos))) { free(ids); return rc; }
    /* the BOS each chunk starts with: what the tokenizer puts before any text, if anything */
    const int bos = n_bos > 0 && n > 0 && ids[0] == bos_ids[0] ? bos_ids[0] : -1;
    free(bos_ids);
    if (n < 2 * n_ctx) {
        free(ids);
        return err_set(ERR_ARG, "%s: %d tokens; perplexity with --ctx %d needs at least %d (two chunks)", path, n, n_ctx, 2 * n_ctx);
    }
    const int n_chunk = n / n_ctx;

    int *chunk = malloc((size_t)n_ctx * sizeof *chunk), *top = malloc((size_t)n_score * sizeof *top);
    int *base_top = malloc((size_t)n_score * sizeof *base_top);
    float *logits = malloc((size_t)n_score * V * sizeof *logits);
    double *nll = malloc((size_t)n_score * sizeof *nll), *base_nll = malloc((size_t)n_score * sizeof *base_nll);
    float *kld = o->kl ? malloc((size_t)n_chunk * n_score * sizeof *kld) : NULL; /* every position's, for percentiles */
    unsigned char *rec = o->kl || o->kl_base ? malloc((size_t)n_score * KL_RECORD_BYTES(V)) : NULL;
    FILE *dump = NULL, *base = NULL;
    const char *base_path = o->kl ? o->kl : o->kl_base;
    if (!chunk || !top || !base_top || !logits || !nll || !base_nll || ((o->kl || o->kl_base) && !rec) || (o->kl && !kld))
        rc = err_set(ERR_NOMEM, "perplexity buffers for %d positions of %d logits", n_score, V);
    if (!rc && o->dump_logits && !(dump = fopen(o->dump_logits, "wb"))) rc = err_set(ERR_IO, "%s: %s", o->dump_logits, strerror(errno));
    if (!rc && o->kl) rc = kl_base_open(&base, o->kl, V, n_ctx, n_chunk, ids);
    if (!rc && o->kl_base) {
        if (!(base = fopen(o->kl_base, "wb"))) rc = err_set(ERR_IO, "%s: %s", o->kl_base, strerror(errno));
        else rc = kl_base_write_header(base, o->kl_base, V, n_ctx, n_chunk, ids);
    }

    /* sums over the scored tokens: this model's nll, the base's, their product; KL; the target's
     * probability difference p - p_base (llama.cpp's Δp) */
    double s_nll = 0, s_nll2 = 0, s_bnll = 0, s_bnll2 = 0, s_cross = 0, s_kl = 0, s_kl2 = 0, s_dp2 = 0, s_dp4 = 0;
    long count = 0, same_top = 0;
    const size_t rec_bytes = KL_RECORD_BYTES(V);
    double t0 = time_now();
    for (int c = 0; c < n_chunk && !rc; c++) {
        memcpy(chunk, ids + (size_t)c * n_ctx, (size_t)n_ctx * sizeof *chunk);
        if (bos >= 0) chunk[0] = bos;
        e->n_tokens = 0;
        /* the first half builds the cache; positions first .. n_ctx - 2 give the logits of the next token */
        if ((rc = engine_feed(e, chunk, first)) || (rc = engine_feed_logits(e, chunk + first, n_score, logits))) break;
        if (o->kl && fread(rec, rec_bytes, (size_t)n_score, base) != (size_t)n_score) { rc = err_set(ERR_IO, "%s: read error", o->kl); break; }
        for (int j = 0; j < n_score && o->kl && !rc; j++) rc = kl_record_check(rec + j * rec_bytes, V, o->kl, (long)c * n_score + j);
        if (rc) break;
#pragma omp parallel for schedule(dynamic, 4) num_threads(o->n_threads)
        for (int j = 0; j < n_score; j++) {
            const float *lj = logits + (size_t)j * V;
            const int target = chunk[first + j + 1];
            nll[j] = quality_nll(lj, V, target, &top[j]);
            if (o->kl_base) kl_record_encode(lj, V, target, rec + j * rec_bytes);
            if (o->kl) kld[(size_t)c * n_score + j] = (float)kl_record_compare(rec + j * rec_bytes, V, lj, &base_top[j], &base_nll[j]);
        }
        for (int j = 0; j < n_score; j++) { /* in order: the same sums for any thread count */
            s_nll += nll[j];
            s_nll2 += nll[j] * nll[j];
            if (o->kl) {
                const double k = kld[(size_t)c * n_score + j], dp = exp(-nll[j]) - exp(-base_nll[j]);
                s_bnll += base_nll[j];
                s_bnll2 += base_nll[j] * base_nll[j];
                s_cross += nll[j] * base_nll[j];
                s_kl += k;
                s_kl2 += k * k;
                s_dp2 += dp * dp;
                s_dp4 += dp * dp * dp * dp;
                same_top += top[j] == base_top[j];
            }
        }
        count += n_score;
        if (dump && fwrite(logits, sizeof *logits, (size_t)n_score * V, dump) != (size_t)n_score * V)
            rc = err_set(ERR_IO, "%s: write failed", o->dump_logits);
        if (!rc && o->kl_base && fwrite(rec, rec_bytes, (size_t)n_score, base) != (size_t)n_score)
            rc = err_set(ERR_IO, "%s: write failed", o->kl_base);
    }
    const double seconds = time_now() - t0;
    if (dump && fclose(dump) && !rc) rc = err_set(ERR_IO, "%s: write failed", o->dump_logits);
    if (base && fclose(base) && !rc && o->kl_base) rc = err_set(ERR_IO, "%s: write failed", o->kl_base);
    if (rc && o->kl_base) remove(o->kl_base); /* never leave half a base to compare against */
    if (!rc) {
        double m, err;
        quality_mean_err(s_nll, s_nll2, count, &m, &err);
        printf("perplexity: %.4f ± %.5f over %d chunks of %d tokens, %ld scored (%.1f tok/s)\n", exp(m), exp(m) * err, n_chunk,
               n_ctx, count, (double)n_chunk * n_ctx / seconds);
        if (o->kl) {
            double bm, berr, km, kerr, dm, derr;
            quality_mean_err(s_bnll, s_bnll2, count, &bm, &berr);
            quality_mean_err(s_kl, s_kl2, count, &km, &kerr);
            quality_mean_err(s_dp2, s_dp4, count, &dm, &derr);
            /* llama.cpp's: the two models' mean nll are correlated; the ratio's error counts that */
            const double cov = count > 1 ? (s_cross / count - m * bm) / (count - 1) : 0.0;
            const double lr = m - bm, lr_var = err * err + berr * berr - 2.0 * cov, lr_err = lr_var > 0 ? sqrt(lr_var) : 0.0;
            const double same = (double)same_top / count, same_err = count > 1 ? sqrt(same * (1 - same) / (count - 1)) : 0.0;
            qsort(kld, (size_t)count, sizeof *kld, cmp_float);
            printf("kl: against %s\n", base_path);
            printf("  ppl(Q)                 %.6f ± %.6f\n", exp(m), exp(m) * err);
            printf("  ppl(base)              %.6f ± %.6f\n", exp(bm), exp(bm) * berr);
            printf("  ln(ppl(Q)/ppl(base))   %.6f ± %.6f\n", lr, lr_err);
            printf("  ppl(Q)/ppl(base)       %.6f ± %.6f\n", exp(lr), exp(lr) * lr_err);
            printf("  mean KL                %.6f ± %.6f\n", km, kerr);
            printf("  KL median, 99%%, max    %.6f %.6f %.6f\n", percentile(kld, count, 0.5), percentile(kld, count, 0.99), kld[count - 1]);
            printf("  RMS dp                 %.3f ± %.3f %%\n", 100.0 * sqrt(dm), dm > 0 ? 100.0 * 0.5 / sqrt(dm) * derr : 0.0);
            printf("  same top               %.3f ± %.3f %%\n", 100.0 * same, 100.0 * same_err);
        }
        if (o->kl_base) printf("kl-base: %s: %ld positions\n", o->kl_base, count);
    }
    free(ids);
    free(chunk);
    free(top);
    free(base_top);
    free(logits);
    free(nll);
    free(base_nll);
    free(kld);
    free(rec);
    return rc;
}

/* Prompt and decode speed. On the CPU, decode at depth d first fills the cache with d prompt
 * tokens; on the GPU the cache up to d is filled with random values (decode speed depends on how
 * much cache it reads, not on what the cache holds; prefilling 32k tokens one by one would take
 * minutes). The prompt is --bench-prompt tokens (128), its last token's choice included (the time to
 * the first token). At each depth past 0 it is timed once more after the first d (a later turn of a
 * conversation: its attention reads the cache), then decode continues from d.
 * GB/s counts the weights and the KV cache each step reads; the share is of the read bandwidth the
 * probe measured in this run on the same device. */
/* The arithmetic of n prompt tokens after `depth` cached ones, as the prompt path does it: 2 flops a
 * weight of the layers' matrices a token (the LM head runs for the last token only: left out), and
 * the causal attention's QK^T and PV, 4 q_dim flops a layer for each position a token sees. The
 * share of a device's tensor-core (or SIMD) rate is this over the time, over a plain GEMM's rate
 * (tests/bench/gemm_probe.py on the GPU). */
static double prompt_flops(int n, int depth) {
    const double mats = (double)MODEL_DIM * (2.0 * MODEL_Q_DIM + 2.0 * MODEL_KV_DIM) + 3.0 * MODEL_DIM * MODEL_HIDDEN_DIM;
    const double seen = (double)n * depth + (double)n * (n + 1) / 2; /* positions seen, summed over the tokens */
    return MODEL_N_LAYERS * (2.0 * mats * n + 4.0 * MODEL_Q_DIM * seen);
}

/* Timed passes of each --bench prompt; the median is reported (METHOD.md: repeat, take the median).
 * Single passes of the 1B shape's 512-token prompt on the CPU of one 16-core host ranged 334-444
 * tok/s from run to run. */
#define PROMPT_REPS 3

/* The median seconds of PROMPT_REPS passes of fill[0..n) after `at` cached tokens; the cache is
 * left at `at` (the next tokens overwrite the prompt's entries). */
static err_code time_prompt(engine *e, const int *fill, int n, int at, double *seconds) {
    double s[PROMPT_REPS];
    for (int r = 0; r < PROMPT_REPS; r++) {
        e->n_tokens = at;
        const double t0 = time_now();
        err_code rc = engine_feed(e, fill, n);
        s[r] = time_now() - t0;
        if (rc) return rc;
    }
    e->n_tokens = at;
    for (int i = 1; i < PROMPT_REPS; i++) /* insertion sort of three */
        for (int j = i; j > 0 && s[j - 1] > s[j]; j--) {
            const double t = s[j];
            s[j] = s[j - 1];
            s[j - 1] = t;
        }
    *seconds = s[PROMPT_REPS / 2];
    return ERR_OK;
}

static err_code run_bench(engine *e, const options *o) {
    static const char text[] =
        "The history of computing is a story of machines that read and write memory. Every step of a language "
        "model's decoding reads all of its weights once, so the speed of one stream is set by memory bandwidth. ";
    int n_decode = o->n_tokens < 0 ? 64 : o->n_tokens, n_prompt = o->bench_prompt ? o->bench_prompt : 128;
    int depths[16], n_depths = 0, max_depth = 0, skipped[16], n_skipped = 0;
    if ((long long)n_prompt + n_decode > e->ctx)
        return err_set(ERR_ARG, "--bench needs at least %lld tokens of context, --ctx is %d", (long long)n_prompt + n_decode, e->ctx);
    /* sizes in 64 bits: -n, --bench-prompt and each depth may each be up to INT_MAX */
    for (const char *p = o->bench_depths; *p;) {
        char *end;
        errno = 0;
        long d = strtol(p, &end, 10);
        if (end == p || (*end && *end != ',') || d < 0 || d > INT_MAX || errno)
            return err_set(ERR_ARG, "--bench-depths %s: expected comma-separated integers in 0..%d", o->bench_depths, INT_MAX);
        if (n_depths + n_skipped == 16) return err_set(ERR_ARG, "--bench-depths %s: at most 16 depths", o->bench_depths);
        p = *end == ',' ? end + 1 : end;
        if ((long long)d + n_decode + 1 > e->ctx) { /* deeper than the context allows */
            skipped[n_skipped++] = (int)d;
            continue;
        }
        depths[n_depths++] = (int)d;
        max_depth = d > max_depth ? (int)d : max_depth;
    }
    if (n_depths == 0)
        return err_set(ERR_ARG, "--bench-depths %s: no depth leaves room for %d decoded tokens in the context of %d",
                       o->bench_depths, n_decode, e->ctx);
    for (int i = 0; i < n_skipped; i++) /* a warning, once the run goes ahead */
        fprintf(stderr, "ingot: --bench: depth %d skipped: %d + %d decoded tokens exceed the context of %d\n", skipped[i],
                skipped[i], n_decode, e->ctx);
    int *base, nb;
    err_code rc = engine_encode(e, text, 0, &base, &nb);
    if (rc) return rc;
    int fill_len = n_prompt; /* the CPU prefills its depths with real tokens, the GPU fills the cache */
    if (!e->gpu && max_depth > fill_len) fill_len = max_depth;
    int *fill = malloc((size_t)fill_len * sizeof(int));
    if (!fill) { free(base); return err_set(ERR_NOMEM, "bench prompt"); }
    for (int i = 0; i < fill_len; i++) fill[i] = base[i % nb];
    free(base);

    double probe;
    char device[256] = "cpu";
#ifdef INGOT_CUDA
    if (e->gpu) rc = probe_cuda_read_bandwidth((size_t)4 << 30, &probe, device, sizeof device);
    else
#endif
        rc = probe_cpu_read_bandwidth((size_t)1 << 30, o->n_threads, &probe);
    if (rc) { free(fill); return rc; }
    /* the CPU's arithmetic rate, which its prompt is a share of (the GPU's: tests/bench/gemm_probe.py) */
    const double fma_rate = e->gpu ? 0.0 : probe_cpu_fma_rate(o->n_threads);

    /* once untimed first: the first prompt also pays for first touches (the CPU's mapped weights
     * paged in: 161 against 331 tok/s on the dev VM) */
    e->n_tokens = 0;
    rc = engine_feed(e, fill, n_prompt);
    double prompt_s = 0.0, t0;
    if (!rc) rc = time_prompt(e, fill, n_prompt, 0, &prompt_s);

    sampler_config greedy = o->sampling;
    greedy.temperature = 0.0f;
    greedy.repeat_penalty = 1.0f;
    sampler s;
    if (!rc) rc = engine_sampler_init(e, &s, &greedy);
    if (rc) { free(fill); return rc; }
    double tok_s[16], gbs[16], prompt_at[16]; /* prompt_at: tok/s, or < 0 where the context has no room */
    for (int d = 0; d < n_depths && !rc; d++) {
        e->n_tokens = 0;
#ifdef INGOT_CUDA
        if (e->gpu && depths[d] > 0) {
            rc = model_cuda_fill_cache(e->gpu, depths[d]);
            for (int i = 0; i < depths[d]; i++) e->tokens[i] = fill[i % n_prompt];
            e->n_tokens = depths[d];
        } else
#endif
            if (depths[d] > 0) rc = engine_feed(e, fill, depths[d]);
        prompt_at[d] = -1.0;
        if (!rc && depths[d] > 0 && depths[d] + n_prompt <= e->ctx) {
            double at_s = 0.0;
            rc = time_prompt(e, fill, n_prompt, depths[d], &at_s); /* back to depth d after */
            prompt_at[d] = n_prompt / at_s;
        }
        if (!rc) rc = engine_feed(e, fill, 1); /* decode continues after one more token */
        int start = e->n_tokens, produced = 0, full;
#ifdef INGOT_CUDA
        if (e->gpu && o->bench_kernels && !rc) rc = model_cuda_kernel_bench(e->gpu, start, 20, stdout);
#endif
        if (e->cpu && o->bench_kernels && !rc) rc = model_cpu_stage_bench(e->cpu, start, 20, stdout);
        t0 = time_now();
        if (!rc) rc = engine_generate(e, &s, n_decode, NULL, &produced, &full);
        double dt = time_now() - t0;
        /* Step i reads the weights and the cache up to position start + i. */
        double bytes = (double)MODEL_WEIGHT_BYTES_PER_TOKEN * produced +
                       (double)kv_bytes_per_pos(o->kv_cache) * ((double)produced * start + (double)produced * (produced + 1) / 2);
        tok_s[d] = produced / dt;
        gbs[d] = bytes / dt / 1e9;
    }
    sampler_free(&s);
    free(fill);
    if (rc) return rc;
    double prompt_tok_s = n_prompt / prompt_s;
    const char *dev = e->gpu ? "cuda" : "cpu";
    if (o->json) {
        printf("{\"model\": \"%s\", \"device\": \"%s\", \"device_name\": \"%s\", \"threads\": %d, "
               "\"weight_bytes_per_token\": %llu, \"kv_bytes_per_position\": %llu, \"probe_gb_s\": %.2f, "
               "\"prompt_tokens\": %d, \"prompt_tok_s\": %.2f, \"prompt_tflop_s\": %.4f, ",
               MODEL_NAME, dev, device, e->gpu ? 0 : o->n_threads, MODEL_WEIGHT_BYTES_PER_TOKEN, kv_bytes_per_pos(o->kv_cache),
               probe / 1e9, n_prompt, prompt_tok_s, prompt_flops(n_prompt, 0) / prompt_s / 1e12);
        if (e->gpu) printf("\"fma_probe_tflop_s\": null, \"decode\": [");
        else printf("\"fma_probe_tflop_s\": %.4f, \"decode\": [", fma_rate / 1e12);
        for (int d = 0; d < n_depths; d++) {
            printf("%s{\"depth\": %d, \"tokens\": %d, \"tok_s\": %.2f, \"us_per_token\": %.1f, \"gb_s\": %.2f, "
                   "\"share_of_probe\": %.4f, \"prompt_tok_s\": ",
                   d ? ", " : "", depths[d], n_decode, tok_s[d], 1e6 / tok_s[d], gbs[d], gbs[d] * 1e9 / probe);
            const double p_at = depths[d] == 0 ? prompt_tok_s : prompt_at[d];
            if (p_at < 0) printf("null}");
            else printf("%.2f}", p_at);
        }
        printf("]}\n");
    } else {
        printf("bench: %s on %s", MODEL_NAME, e->gpu ? device : "cpu");
        if (!e->gpu) printf(", %d threads", o->n_threads);
        printf(", %.1f MB of weights read per token\n", MODEL_WEIGHT_BYTES_PER_TOKEN / 1e6);
        printf("  read bandwidth probe: %.1f GB/s\n", probe / 1e9);
        if (!e->gpu) printf("  FMA probe: %.3f TFLOP/s (fp32)\n", fma_rate / 1e12);
        for (int d = -1; d < n_depths; d++) { /* -1: the prompt at depth 0, before the decode runs */
            const int depth = d < 0 ? 0 : depths[d];
            const double p_tok_s = d < 0 ? prompt_tok_s : prompt_at[d];
            if (d >= 0 && p_tok_s < 0) continue;
            const double tflop_s = prompt_flops(n_prompt, depth) * p_tok_s / n_prompt / 1e12;
            if (d < 0) printf("  prompt: %d tokens, %.1f tok/s, %.3f TFLOP/s", n_prompt, p_tok_s, tflop_s);
            else printf("  prompt at depth %d: %d tokens, %.1f tok/s, %.3f TFLOP/s", depth, n_prompt, p_tok_s, tflop_s);
            if (!e->gpu) printf(" = %.1f%% of the FMA probe", 100.0 * tflop_s * 1e12 / fma_rate);
            printf("\n");
        }
        for (int d = 0; d < n_depths; d++)
            printf("  decode at depth %d: %d tokens, %.1f tok/s, %.0f us/token, %.1f GB/s = %.1f%% of probe\n", depths[d],
                   n_decode, tok_s[d], 1e6 / tok_s[d], gbs[d], 100.0 * gbs[d] * 1e9 / probe);
    }
    return ERR_OK;
}

// ----------------------------------------------------------------------------------------------

static int fail(err_code rc) {
    fprintf(stderr, "ingot: %s: %s\n", err_name(rc), err_detail());
    return 1;
}

int main(int argc, char **argv) {
    options o;
    err_code rc = parse_args(argc, argv, &o);
    if (rc) return fail(rc);
    int bundled; /* an appliance: its model inside this executable (make appliance) */
    if ((rc = bundle_open(argv[0], &bundled))) return fail(rc);
    if (bundled && !o.model_given) o.model_dir = bundle_dir();
#if MODEL_GENERIC
    if ((rc = model_generic_load(o.model_dir))) return fail(rc); /* the MODEL_* values, from config.json */
#endif
    if ((rc = check_model_args(&o))) return fail(rc);

    /* The prompt: -p, -f, or stdin when it is not a terminal (not for interactive chat). */
    char *text = NULL;
    size_t len = 0;
    int needs_text = !o.bench && !(o.chat && !o.tokenize && !o.prompt && !o.prompt_file) && !o.perplexity_file && !o.serve;
    if (o.prompt) {
        text = strdup(o.prompt);
        len = strlen(text);
    } else if (o.prompt_file) {
        if ((rc = read_file(o.prompt_file, &text, &len))) return fail(rc);
    } else if (needs_text) {
        if (isatty(STDIN_FILENO)) return fail(err_set(ERR_ARG, "no prompt: give -p TEXT, -f FILE or text on stdin (see --help)"));
        if ((rc = read_file("-", &text, &len))) return fail(rc);
    }
    if (text && strlen(text) != len) {
        rc = err_set(ERR_UTF8, "the prompt holds a NUL byte at offset %zu", strlen(text));
        free(text);
        return fail(rc);
    }

    engine e;
    engine_config ec = {.model_dir = o.model_dir, .ctx = o.ctx, .n_threads = o.n_threads,
                        .cuda = strcmp(o.device, "cuda") == 0, .host_logits = o.dump_logits || o.perplexity_file,
                        .check_weights = o.check_weights, .kv_cache = o.kv_cache, .exact_prompt = o.exact_prompt};
    rc = engine_open(&e, &ec);
    if (!rc) {
        if (o.serve) {
            o.server.model_name = MODEL_NAME; /* a generic build knows it once the model is read */
            rc = server_run(&e, &o.server);
        }
        else if (o.tokenize) rc = run_tokenize(&e, &o, text);
        else if (o.perplexity_file) rc = run_perplexity(&e, &o);
        else if (o.dump_logits) rc = run_dump_logits(&e, text, o.dump_logits, o.dump_prefill);
        else if (o.bench) rc = run_bench(&e, &o);
        else if (o.chat) rc = run_chat(&e, &o, text);
        else rc = run_completion(&e, &o, text);
    }
    engine_close(&e);
    free(text);
#if MODEL_GENERIC
    model_generic_free();
#endif
    return rc ? fail(rc) : 0;
}
