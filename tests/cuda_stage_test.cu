/* cuda_stage_test.cu - each decode stage kernel of one model's build alone on random inputs, and
 * the prompt path's GEMM stages at its narrowest and widest batch: the slow twins' half on the GPU
 * (issue 58, item 4). tests/test_gpu_stages.py builds it for a tiny
 * variant, runs it a stage at a time and checks every output against NumPy in float64.
 *
 * It includes runtime/forward_cuda.cu, so it launches that build's own static kernels with the
 * grids, block sizes, dynamic shared memory and kernel attributes model_cuda_init and enqueue_step
 * give them (one_wave's grids, cudaFuncSetAttribute past 48 KB, the carveout, RoPE's table in
 * constant memory, the counters zeroed, the polled buffers' ATT_POLL_WORD convention), through the
 * same launch() (programmatic stream serialization; the first kernel on the stream, so its
 * griddepcontrol.wait returns at once). Compiled exactly as forward_cuda.cu (-Iruntime -I<gen>);
 * make's rule: `make stage-test MODEL=...` builds build/<name>/cuda_stage_test.
 *
 *   cuda_stage_test --list                        the stages this build has, one a line
 *   cuda_stage_test OUTDIR SEED [--stage NAME]... [--ctx N]
 *
 * For each stage (all, or those named) it draws inputs from SEED and the stage's name (small
 * random bf16/fp16 weights, normal fp32 activations, a random fp16 KV cache to a random depth),
 * fills every output with NaN (fp32 0x7FC00000, fp16 0x7E00: not ATT_POLL_WORD), launches the
 * kernel alone, checks the launch and the stream, and writes each input and output as a raw
 * little-endian file OUTDIR/<stage>.<array>.bin; OUTDIR/manifest.json names each array's file,
 * dtype ("bf16", "f16", "f32", "i32", "u32") and shape, with the stage's kernel, launch shape and
 * parameters and the build's dimensions and plan. Exit 0 when every launch ran; any CUDA error
 * exits 1 naming the stage. Nothing is compared here: the test does that. */
#include "forward_cuda.cu"

#include <math.h>
#include <sys/stat.h>

#include <string>
#include <vector>

#if MODEL_GENERIC
#error "tests/cuda_stage_test.cu: a specialized build (the generic build's dimensions are read at run time)"
#endif

#if defined(MODEL_WEIGHT_DTYPE_F32)
int main(void) {
    fprintf(stderr, "cuda_stage_test: fp32 weights have no GPU kernels\n");
    return 77;
}
#else

// ---------------------------------------------------------------------------------------------
// Errors name the stage being run

static const char *current_stage = "(setup)";

#define SC(call)                                                                                                 \
    do {                                                                                                         \
        cudaError_t e_ = (call);                                                                                 \
        if (e_ != cudaSuccess) {                                                                                 \
            fprintf(stderr, "cuda_stage_test: stage %s: CUDA error: %s at %s:%d (%s)\n", current_stage,         \
                    cudaGetErrorString(e_), __FILE__, __LINE__, #call);                                          \
            exit(1);                                                                                             \
        }                                                                                                        \
    } while (0)

static void fail(const char *what) {
    fprintf(stderr, "cuda_stage_test: stage %s: %s\n", current_stage, what);
    exit(1);
}

// ---------------------------------------------------------------------------------------------
// Random inputs: splitmix64, seeded from the command line's seed and the stage's name, so that a
// stage's inputs do not depend on which other stages run.

struct rng {
    uint64_t s;
    uint64_t next() {
        uint64_t z = (s += 0x9E3779B97F4A7C15ULL);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
        return z ^ (z >> 31);
    }
    double unit() { return (double)(next() >> 11) * 0x1.0p-53; }         /* [0, 1) */
    double uniform(double a, double b) { return a + (b - a) * unit(); }   /* [a, b) */
    int below(int n) { return (int)(next() % (uint64_t)n); }              /* [0, n) */
    int between(int lo, int hi) { return lo >= hi ? lo : lo + below(hi - lo + 1); } /* [lo, hi] */
    double normal() { return sqrt(-2.0 * log(1.0 - unit())) * cos(6.283185307179586 * unit()); }
};

static rng stage_rng(uint64_t seed, const char *stage) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a of the name */
    for (const char *c = stage; *c; c++) h = (h ^ (uint8_t)*c) * 1099511628211ULL;
    rng r = {seed ^ h};
    r.next();
    return r;
}

// ---------------------------------------------------------------------------------------------
// Host words

static inline uint16_t f32_to_bf16(float f) { /* round to nearest even; the inputs are finite */
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
static inline uint16_t f32_to_f16(float f) {
    const __half_raw h = __float2half_rn(f);
    return h.x;
}
static float f32_of_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
#define F32_POISON 0x7FC00000u /* a quiet NaN, not ATT_POLL_WORD */
#define F16_POISON 0x7E00u
#if GPU_W_BF16
#define W_DTYPE "bf16"
static uint16_t weight_word(float f) { return f32_to_bf16(f); }
#else
#define W_DTYPE "f16"
static uint16_t weight_word(float f) { return f32_to_f16(f); }
#endif

/* n weights ~ normal * scale (rounded to the device's weight type) */
static std::vector<uint16_t> weights(rng &r, size_t n, double scale) {
    std::vector<uint16_t> w(n);
    for (size_t i = 0; i < n; i++) w[i] = weight_word((float)(r.normal() * scale));
    return w;
}
/* an RMSNorm's weights: 1 +- 0.5 */
static std::vector<uint16_t> norm_weights(rng &r, size_t n) {
    std::vector<uint16_t> w(n);
    for (size_t i = 0; i < n; i++) w[i] = weight_word((float)r.uniform(0.5, 1.5));
    return w;
}
static std::vector<float> activations(rng &r, size_t n, double scale) {
    std::vector<float> x(n);
    for (size_t i = 0; i < n; i++) x[i] = (float)(r.normal() * scale);
    return x;
}
static std::vector<float> poison_f32(size_t n) { return std::vector<float>(n, f32_of_bits(F32_POISON)); }

// ---------------------------------------------------------------------------------------------
// A stage's record: its arrays (written as they are made) and its manifest entry

static std::string out_dir;

struct array_rec {
    std::string name, dtype;
    std::vector<long long> shape;
    bool output;
};

struct stage_rec {
    std::string name, kernel;
    int grid_x = 1, grid_y = 1, block = 0;
    size_t smem = 0;
    std::vector<std::pair<std::string, long long>> params;
    std::vector<array_rec> arrays;
    std::vector<void *> dev; /* freed after the stage */

    void param(const char *k, long long v) { params.push_back({k, v}); }

    void save(bool output, const char *name, const char *dtype, const void *host, size_t bytes, std::vector<long long> shape) {
        long long n = 1;
        for (long long d : shape) n *= d;
        const size_t elem = strcmp(dtype, "bf16") == 0 || strcmp(dtype, "f16") == 0 ? 2 : 4;
        if ((size_t)n * elem != bytes) fail("an array's shape does not match its bytes");
        const std::string path = out_dir + "/" + this->name + "." + name + ".bin";
        FILE *f = fopen(path.c_str(), "wb");
        if (!f || fwrite(host, 1, bytes, f) != bytes || fclose(f) != 0) {
            fprintf(stderr, "cuda_stage_test: %s: cannot write\n", path.c_str());
            exit(1);
        }
        arrays.push_back({name, dtype, shape, output});
    }
    template <typename T>
    void input(const char *name, const char *dtype, const std::vector<T> &v, std::vector<long long> shape) {
        save(false, name, dtype, v.data(), v.size() * sizeof(T), shape);
    }

    template <typename T>
    T *upload(const std::vector<T> &v) {
        T *d = NULL;
        SC(cudaMalloc(&d, v.size() * sizeof(T)));
        SC(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
        dev.push_back(d);
        return d;
    }
    /* an input array: saved, and uploaded */
    template <typename T>
    T *in(const char *name, const char *dtype, const std::vector<T> &v, std::vector<long long> shape) {
        input(name, dtype, v, shape);
        return upload(v);
    }
    /* an output array: count elements of T read back and saved */
    template <typename T>
    void out(const char *name, const char *dtype, const T *d, size_t count, std::vector<long long> shape) {
        std::vector<T> h(count);
        SC(cudaMemcpy(h.data(), d, count * sizeof(T), cudaMemcpyDeviceToHost));
        save(true, name, dtype, h.data(), count * sizeof(T), shape);
    }
    void free_all() {
        for (void *p : dev) SC(cudaFree(p));
        dev.clear();
    }
};

static std::vector<stage_rec> done_stages;

// ---------------------------------------------------------------------------------------------
// The launch state model_cuda_init makes: the kernels' attributes and grids

static cudaStream_t stream;
static int sms, ctx, n_splits;
static int grid_qkv, grid_o, grid_gate_up, grid_down, grid_lm_head, grid_mlp;
static int short_kernel_splits, short_kernel_positions; /* MODEL_ATT_SHORT */
static cudaDeviceProp prop;

/* The split GEMMs' splits a batch size, as prefill_split_counts gives the model's */
static int qkv_split_count[PREFILL_SIZES], o_split_count[PREFILL_SIZES], down_split_count[PREFILL_SIZES];

template <int B>
static void split_counts(void) {
    constexpr int s = prefill_size_index(B);
    qkv_split_count[s] = gemm_splits(gemm_tiles(QKV_PAIRS), MODEL_DIM, sms, gemm_resident((const void *)prefill_qkv_gemm_kernel<B>, B));
    down_split_count[s] = gemm_splits(gemm_tiles(MODEL_DIM / 2), MODEL_HIDDEN_DIM, sms,
                                      gemm_resident((const void *)prefill_down_gemm_kernel<B>, B));
    o_split_count[s] = gemm_splits(gemm_tiles(MODEL_DIM / 2), MODEL_Q_DIM, sms, gemm_resident((const void *)prefill_o_gemm_kernel<B>, B));
    if constexpr (B > PREFILL_SMALL) split_counts<B / 2>();
}

static void init_like_model(void) {
    SC(cudaGetDeviceProperties(&prop, 0));
    if (prop.major * 10 + prop.minor < MODEL_CUDA_ARCH) fail("the GPU is older than the build's target");
    sms = prop.multiProcessorCount;
    SC(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    set_decode_carveout(); /* the step's carveout (forward_cuda.cu), before the occupancy queries */
    grid_qkv = one_wave((const void *)rmsnorm_qkv_rope_kernel<kv_f16>, MODEL_GRID_QKV, QKV_SMEM_BYTES(w_qkv, MODEL_DIM), sms);
    grid_o = one_wave((const void *)o_proj_residual_kernel<false>, MODEL_GRID_O, MV_SMEM_BYTES(MODEL_Q_DIM), sms);
    SC(cudaFuncSetAttribute((const void *)o_proj_residual_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            (int)MV_SMEM_BYTES(MODEL_Q_DIM)));
    SC(cudaFuncSetAttribute((const void *)decode_attention_kernel<kv_f16>(), cudaFuncAttributeMaxDynamicSharedMemorySize, (int)ATT_DECODE_SMEM_BYTES));
    grid_gate_up = one_wave((const void *)rmsnorm_gate_up_silu_kernel, MODEL_GRID_GATE_UP, MV_SMEM_BYTES(MODEL_DIM), sms);
    grid_down = one_wave((const void *)down_residual_kernel, MODEL_GRID_DOWN, MV_SMEM_BYTES(MODEL_HIDDEN_DIM), sms);
    grid_lm_head = one_wave((const void *)rmsnorm_lm_head_argmax_kernel, MODEL_GRID_LM_HEAD, MV_SMEM_BYTES(MODEL_DIM), sms);
    grid_mlp = 0;
#if MODEL_MLP_FUSED
    SC(cudaFuncSetAttribute((const void *)mlp_fused_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)MLP_SMEM_BYTES(MODEL_DIM)));
    grid_mlp = sms < MODEL_HIDDEN_DIM ? sms : MODEL_HIDDEN_DIM;
#endif
    n_splits = MODEL_ATT_MIN_SPLITS > (ctx + ATT_TILE - 1) / ATT_TILE ? MODEL_ATT_MIN_SPLITS : (ctx + ATT_TILE - 1) / ATT_TILE;
    if (n_splits > ATT_TILE / 2) fail("--ctx: more attention splits than the combine holds");
    short_kernel_splits = short_kernel_positions = 0;
#if MODEL_ATT_SHORT
    short_kernel_splits = 1;
    if (ATT_MIN_CHUNK <= att_short_max(MODEL_HEAD_DIM))
        short_kernel_splits = std::min({n_splits, MODEL_ATT_MIN_SPLITS, att_short_max(MODEL_HEAD_DIM) / 2});
    short_kernel_positions = short_kernel_splits * att_short_max(MODEL_HEAD_DIM);
    SC(cudaFuncSetAttribute((const void *)short_attention_kernel<kv_f16>(), cudaFuncAttributeMaxDynamicSharedMemorySize,
                            (int)ATT_SHORT_SMEM_BYTES(MODEL_KV_MUL, MODEL_HEAD_DIM)));
#endif
    SC(cudaMemcpyToSymbol(rope_inv_freq, model_rope_inv_freq, MODEL_HEAD_DIM / 2 * sizeof(float)));
    prefill_gemm_smem<PREFILL_BATCH>(); /* the GEMMs' shared memory, as model_cuda_init */
    split_counts<PREFILL_BATCH>();
}

/* The launch's shape, into the record; after launch(): the launch and the kernel's run checked */
static void launched(stage_rec &s, const char *kernel, int gx, int gy, int block, size_t smem) {
    s.kernel = kernel, s.grid_x = gx, s.grid_y = gy, s.block = block, s.smem = smem;
    SC(cudaGetLastError());
    SC(cudaStreamSynchronize(stream));
}

// ---------------------------------------------------------------------------------------------
// Common inputs

#define D MODEL_DIM
#define HID MODEL_HIDDEN_DIM
#define QD MODEL_Q_DIM
#define KVD MODEL_KV_DIM
#define HD MODEL_HEAD_DIM
#define NKV MODEL_N_KV_HEADS
#define VOCAB MODEL_VOCAB_SIZE

/* io = {pos, poisoned next, 0} */
static int *io_at(stage_rec &s, int pos) {
    std::vector<int> io(IO_INTS, 0);
    io[IO_POS] = pos;
    io[IO_NEXT] = -1;
    s.param("pos", pos);
    return s.upload(io);
}

/* A layer's fp16 cache (n_kv_heads, ctx, head_dim): uniform in [-1, 1) at positions [0, filled),
 * `beyond` at the positions past them (a kernel that reads past its context sees it) */
static std::vector<uint16_t> cache_words(rng &r, int filled, float beyond) {
    std::vector<uint16_t> c((size_t)NKV * ctx * HD);
    for (int h = 0; h < NKV; h++)
        for (int p = 0; p < ctx; p++)
            for (int d = 0; d < HD; d++)
                c[kv_at(p, h, ctx, HD) + d] = f32_to_f16(p < filled ? (float)r.uniform(-1.0, 1.0) : beyond);
    return c;
}

static std::vector<long long> cache_shape(void) { return {NKV, ctx, HD}; }

/* A fresh layer's weights with nothing bound (each stage binds what its kernel reads) */
static cuda_layer no_weights(void) {
    cuda_layer w;
    memset(&w, 0, sizeof w);
    return w;
}

/* a matvec's weights (rows, K), normal / sqrt(K) * gain: outputs of order gain for inputs of order 1 */
static const uint16_t *matrix(stage_rec &s, rng &r, const char *name, int rows, int K, double gain = 1.0) {
    return s.in(name, W_DTYPE, weights(r, (size_t)rows * K, gain / sqrt((double)K)), {rows, K});
}

// ---------------------------------------------------------------------------------------------
// The stages

static void stage_embed(stage_rec &s, rng &r) {
    const int pos = r.between(0, ctx - 1), token = r.below(VOCAB);
    const uint16_t *embed = s.in("embed", W_DTYPE, weights(r, (size_t)VOCAB * D, 1.0), {VOCAB, D});
    int *io = io_at(s, pos);
    std::vector<int> history(ctx);
    for (int &t : history) t = r.below(VOCAB);
    history[pos] = token;
    s.param("token", token);
    int *hist = s.in("history", "i32", history, {ctx});
    float *x = s.upload(poison_f32(D));
    float *zero = MODEL_MLP_FUSED ? s.upload(poison_f32(D)) : NULL;
    const int grid = (D + 255) / 256;
    launch(embed_kernel, grid, 1, 256, 0, stream, embed, (const int *)io, x, (const int *)hist, zero);
    launched(s, "embed_kernel", grid, 1, 256, 0);
    s.out("x", "f32", x, D, {D});
    if (zero) s.out("zero", "f32", zero, D, {D});
}

/* fp16 caches as the kernels take them (cuda_kv.cuh) */
static kv_view<kv_f16> f16_cache(uint16_t *k, uint16_t *v) { return kv_view<kv_f16>{k, v, NULL, NULL, NULL}; }

static void stage_qkv(stage_rec &s, rng &r) {
    const int pos = r.between(1, ctx - 1);
    cuda_layer w = no_weights();
    w.attn_norm = s.in("attn_norm", W_DTYPE, norm_weights(r, D), {D});
    w.wq = matrix(s, r, "wq", QD, D);
    w.wk = matrix(s, r, "wk", KVD, D);
    w.wv = matrix(s, r, "wv", KVD, D);
    if (MODEL_QKV_BIAS) {
        w.bq = s.in("bq", W_DTYPE, weights(r, QD, 0.5), {QD});
        w.bk = s.in("bk", W_DTYPE, weights(r, KVD, 0.5), {KVD});
        w.bv = s.in("bv", W_DTYPE, weights(r, KVD, 0.5), {KVD});
    }
    float *x = s.in("x", "f32", activations(r, D, 1.0), {D});
    int *io = io_at(s, pos);
    /* the caches full of earlier positions' values; position pos poisoned: the kernel writes it */
    std::vector<uint16_t> kc = cache_words(r, ctx, 0.0f), vc = cache_words(r, ctx, 0.0f);
    for (int h = 0; h < NKV; h++)
        for (int d = 0; d < HD; d++) kc[kv_at(pos, h, ctx, HD) + d] = vc[kv_at(pos, h, ctx, HD) + d] = F16_POISON;
    uint16_t *kcd = s.in("key_cache", "f16", kc, cache_shape()), *vcd = s.in("value_cache", "f16", vc, cache_shape());
    float *q = s.upload(poison_f32(QD));
    /* the polled buffer it puts back to ATT_POLL_WORD (MODEL_DOWN_POLL, split MLP), zeros before */
    float *hb_poll = s.upload(std::vector<float>(HID, 0.0f));
    std::vector<float> inv(model_rope_inv_freq, model_rope_inv_freq + HD / 2);
    s.input("rope_inv_freq", "f32", inv, {HD / 2});
    s.param("ctx", ctx);
    launch(rmsnorm_qkv_rope_kernel<kv_f16>, grid_qkv, 1, MV_THREADS, QKV_SMEM_BYTES(w_qkv, MODEL_DIM), stream, w, (const float *)x, q,
           f16_cache(kcd, vcd), (const int *)io, ctx, hb_poll);
    launched(s, "rmsnorm_qkv_rope_kernel", grid_qkv, 1, MV_THREADS, QKV_SMEM_BYTES(w_qkv, MODEL_DIM));
    s.out("q", "f32", q, QD, {QD});
    s.out("key_cache_out", "f16", kcd, kc.size(), cache_shape());
    s.out("value_cache_out", "f16", vcd, vc.size(), cache_shape());
    s.out("hb_poll", "u32", reinterpret_cast<const uint32_t *>(hb_poll), HID, {HID});
}

/* The decode attention over positions [0, pos] (the cache written there, as QKV leaves it), with
 * `splits` blocks a KV head; SHORT: attention_short_kernel */
static void stage_attention(stage_rec &s, rng &r, bool short_kernel, int splits, int pos) {
    s.param("n_splits", splits);
    s.param("ctx", ctx);
    float *q = s.in("q", "f32", activations(r, QD, 1.0), {QD});
    int *io = io_at(s, pos);
    uint16_t *kc = s.in("key_cache", "f16", cache_words(r, pos + 1, 512.0f), cache_shape());
    uint16_t *vc = s.in("value_cache", "f16", cache_words(r, pos + 1, 512.0f), cache_shape());
    float *part_acc = s.upload(poison_f32((size_t)MODEL_N_HEADS * splits * HD));
    float *part_ml = s.upload(poison_f32((size_t)MODEL_N_HEADS * splits * 2));
    unsigned *counters = s.upload(std::vector<unsigned>(NKV, 0u));
    float *att = s.upload(poison_f32(QD));
    if (short_kernel) {
#if MODEL_ATT_SHORT
        const size_t smem = ATT_SHORT_SMEM_BYTES(MODEL_KV_MUL, MODEL_HEAD_DIM);
        launch(short_attention_kernel<kv_f16>(), NKV, splits, MODEL_ATT_THREADS, smem, stream, (const float *)q, f16_cache(kc, vc),
               (const int *)io, part_acc, part_ml, counters, att, ctx, splits);
        launched(s, "attention_short_kernel", NKV, splits, MODEL_ATT_THREADS, smem);
#else
        fail("attention_short_kernel: not in this build");
#endif
    } else {
        launch(decode_attention_kernel<kv_f16>(), NKV, splits, MODEL_ATT_THREADS, ATT_DECODE_SMEM_BYTES, stream, (const float *)q,
               f16_cache(kc, vc), (const int *)io, part_acc, part_ml, counters, att, ctx, splits);
        launched(s, "attention_kernel", NKV, splits, MODEL_ATT_THREADS, ATT_DECODE_SMEM_BYTES);
    }
    s.out("att", "f32", att, QD, {QD});
    s.out("counters", "u32", counters, NKV, {NKV});
}

template <bool SHORTEST>
static void stage_o_proj(stage_rec &s, rng &r) {
    cuda_layer w = no_weights();
    w.wo = matrix(s, r, "wo", D, QD);
    if (MODEL_O_BIAS) w.bo = s.in("bo", W_DTYPE, weights(r, D, 0.5), {D});
    float *att = s.in("att", "f32", activations(r, QD, 0.5), {QD});
    float *x = s.in("x", "f32", activations(r, D, 1.0), {D});
    launch(o_proj_residual_kernel<SHORTEST>, grid_o, 1, MV_THREADS, MV_SMEM_BYTES(MODEL_Q_DIM), stream, w, (const float *)att, x);
    launched(s, SHORTEST ? "o_proj_residual_kernel<true>" : "o_proj_residual_kernel<false>", grid_o, 1, MV_THREADS,
             MV_SMEM_BYTES(MODEL_Q_DIM));
    s.out("x_out", "f32", x, D, {D});
}

/* The attention signals gate/up and the fused MLP put back: the count at 5, att_poll at zeros */
static void att_signals(stage_rec &s, unsigned **att_done, float **att_poll) {
    *att_done = s.upload(std::vector<unsigned>(1, 5u));
    *att_poll = s.upload(std::vector<float>(QD, 0.0f));
}
static void att_signals_out(stage_rec &s, const unsigned *att_done, const float *att_poll) {
    s.out("att_done", "u32", att_done, 1, {1});
    s.out("att_poll", "u32", reinterpret_cast<const uint32_t *>(att_poll), QD, {QD});
}

static void stage_gate_up(stage_rec &s, rng &r) {
    cuda_layer w = no_weights();
    w.ffn_norm = s.in("ffn_norm", W_DTYPE, norm_weights(r, D), {D});
    w.w_gate = matrix(s, r, "w_gate", HID, D, 2.0);
    w.w_up = matrix(s, r, "w_up", HID, D);
    float *x = s.in("x", "f32", activations(r, D, 1.0), {D});
    float *hb = s.upload(poison_f32(HID));
    unsigned *att_done;
    float *att_poll;
    att_signals(s, &att_done, &att_poll);
    launch(rmsnorm_gate_up_silu_kernel, grid_gate_up, 1, MV_THREADS, MV_SMEM_BYTES(MODEL_DIM), stream, w, (const float *)x, hb,
           att_done, att_poll);
    launched(s, "rmsnorm_gate_up_silu_kernel", grid_gate_up, 1, MV_THREADS, MV_SMEM_BYTES(MODEL_DIM));
    s.out("hb", "f32", hb, HID, {HID});
    att_signals_out(s, att_done, att_poll);
}

static void stage_down(stage_rec &s, rng &r) {
    cuda_layer w = no_weights();
    w.w_down = matrix(s, r, "w_down", D, HID);
    /* with MODEL_DOWN_POLL the kernel polls hb's words: every one written (no ATT_POLL_WORD) */
    float *hb = s.in("hb", "f32", activations(r, HID, 0.5), {HID});
    float *x = s.in("x", "f32", activations(r, D, 1.0), {D});
    launch(down_residual_kernel, grid_down, 1, MV_THREADS, MV_SMEM_BYTES(MODEL_HIDDEN_DIM), stream, w, (const float *)hb, x);
    launched(s, "down_residual_kernel", grid_down, 1, MV_THREADS, MV_SMEM_BYTES(MODEL_HIDDEN_DIM));
    s.out("x_out", "f32", x, D, {D});
}

#if MODEL_MLP_FUSED
/* down_proj (dim, hidden) transposed as model_cuda_init makes it for the fused MLP */
static uint16_t *transposed_down(stage_rec &s, const uint16_t *w_down) {
    uint16_t *down_t = s.upload(std::vector<uint16_t>((size_t)HID * D, (uint16_t)F16_POISON));
    transpose_words_kernel<<<dim3(MODEL_HIDDEN_DIM / 32, MODEL_DIM / 32), dim3(32, 8), 0, stream>>>(w_down, down_t, MODEL_DIM,
                                                                                                  MODEL_HIDDEN_DIM);
    SC(cudaGetLastError());
    SC(cudaStreamSynchronize(stream));
    return down_t;
}

static void stage_transpose(stage_rec &s, rng &r) {
    const uint16_t *w_down = matrix(s, r, "w_down", D, HID);
    uint16_t *down_t = transposed_down(s, w_down);
    launched(s, "transpose_words_kernel", MODEL_HIDDEN_DIM / 32, MODEL_DIM / 32, 256, 0);
    s.out("down_t", W_DTYPE, down_t, (size_t)HID * D, {HID, D});
}

static void stage_mlp_fused(stage_rec &s, rng &r) {
    cuda_layer w = no_weights();
    w.ffn_norm = s.in("ffn_norm", W_DTYPE, norm_weights(r, D), {D});
    w.w_gate = matrix(s, r, "w_gate", HID, D, 2.0);
    w.w_up = matrix(s, r, "w_up", HID, D);
    w.w_down = matrix(s, r, "w_down", D, HID);
    const uint16_t *down_t = transposed_down(s, w.w_down);
    float *x = s.in("x", "f32", activations(r, D, 1.0), {D});
    /* out zero before (the next layer's buffer, which the layer before zeroed); zero: the buffer it
     * zeroes for the next layer, poisoned */
    float *out = s.upload(std::vector<float>(D, 0.0f));
    float *zero = s.upload(poison_f32(D));
    unsigned *att_done;
    float *att_poll;
    att_signals(s, &att_done, &att_poll);
    launch(mlp_fused_kernel, grid_mlp, 1, MLP_THREADS, MLP_SMEM_BYTES(MODEL_DIM), stream, w, down_t, (const float *)x, out, zero,
           att_done, att_poll);
    launched(s, "mlp_fused_kernel", grid_mlp, 1, MLP_THREADS, MLP_SMEM_BYTES(MODEL_DIM));
    s.out("out", "f32", out, D, {D});
    s.out("zero", "f32", zero, D, {D});
    att_signals_out(s, att_done, att_poll);
}
#endif

static void stage_lm_head(stage_rec &s, rng &r) {
    const uint16_t *norm_w = s.in("final_norm", W_DTYPE, norm_weights(r, D), {D});
    const uint16_t *lm = matrix(s, r, "lm_head", VOCAB, D, 2.0);
    float *x = s.in("x", "f32", activations(r, D, 1.0), {D});
    int *io = io_at(s, r.between(0, ctx - 1));
    float *logits = s.upload(poison_f32(VOCAB));
    float2 *block_best = s.upload(std::vector<float2>(grid_lm_head, make_float2(f32_of_bits(F32_POISON), 0.0f)));
    unsigned *counter = s.upload(std::vector<unsigned>(1, 0u));
    launch(rmsnorm_lm_head_argmax_kernel, grid_lm_head, 1, MV_THREADS, MV_SMEM_BYTES(MODEL_DIM), stream, norm_w, lm, (const float *)x,
           logits, block_best, counter, io);
    launched(s, "rmsnorm_lm_head_argmax_kernel", grid_lm_head, 1, MV_THREADS, MV_SMEM_BYTES(MODEL_DIM));
    s.out("logits", "f32", logits, VOCAB, {VOCAB});
    s.out("io", "i32", io, IO_INTS, {IO_INTS});
    s.out("counter", "u32", counter, 1, {1});
}

// ---------------------------------------------------------------------------------------------
// The stages this build has

struct stage_def {
    const char *name;
    void (*run)(stage_rec &, rng &);
};

// ---------------------------------------------------------------------------------------------
// The prompt path's stages (cuda_prefill.cuh on the GEMM cores of cuda_gemm.cuh), a batch of B
// tokens: PREFILL_SMALL and PREFILL_BATCH, the narrowest and the widest GEMMs. Each launches what
// enqueue_prefill launches for that stage, with the splits prefill_split_counts gives.

/* The batch's 16-bit input terms (PREFILL_TERMS, B, K): t0 random of order scale, t1 a small rest
 * (as prefill_rms_terms_body leaves them: |t1| below half an ulp of t0) */
static std::vector<uint16_t> input_terms(rng &r, int B, int K, double scale) {
    std::vector<uint16_t> t((size_t)PREFILL_TERMS * B * K);
    for (size_t i = 0; i < (size_t)B * K; i++) {
        const double v = r.normal() * scale;
        t[i] = weight_word((float)v);
        for (int k = 1; k < PREFILL_TERMS; k++) t[(size_t)k * B * K + i] = weight_word((float)(v * r.uniform(-1.0, 1.0) * 0x1.0p-9));
    }
    return t;
}
static std::vector<long long> terms_shape(int B, int K) { return {PREFILL_TERMS, B, K}; }
/* a 16-bit output's poison: NaN as bf16 and as fp16 */
#define W_POISON 0x7FFF

/* io for a batch: {pos, poisoned next, count} */
static int *io_batch(stage_rec &s, int pos, int count) {
    std::vector<int> io(IO_INTS, 0);
    io[IO_POS] = pos;
    io[IO_NEXT] = -1;
    io[IO_COUNT] = count;
    s.param("pos", pos);
    s.param("count", count);
    return s.upload(io);
}

/* RMSNorm of the batch: x += two splits' partial sums, then its norm's output as the next GEMM's terms */
template <int B>
static void stage_prefill_rms(stage_rec &s, rng &r) {
    constexpr int parts = 2;
    s.param("batch", B);
    s.param("parts", parts);
    const uint16_t *norm_w = s.in("norm", W_DTYPE, norm_weights(r, D), {D});
    float *x = s.in("x", "f32", activations(r, (size_t)B * D, 1.0), {B, D});
    float *part = s.in("part", "f32", activations(r, (size_t)parts * B * D, 0.5), {parts, B, D});
    uint16_t *terms = s.upload(std::vector<uint16_t>((size_t)PREFILL_TERMS * B * D, W_POISON));
    launch(prefill_rms_terms_kernel, B, 1, RMS_THREADS, 0, stream, x, (const float *)part, parts, norm_w, terms);
    launched(s, "prefill_rms_terms_kernel", B, 1, RMS_THREADS, 0);
    s.out("x_out", "f32", x, (size_t)B * D, {B, D});
    s.out("terms", W_DTYPE, terms, (size_t)PREFILL_TERMS * B * D, terms_shape(B, D));
}

/* QKV as the split GEMM, then its finish (bias, RoPE, q and the caches) */
template <int B>
static void stage_prefill_qkv(stage_rec &s, rng &r) {
    constexpr int size = prefill_size_index(B);
    const int count = B > PREFILL_SMALL ? B - 1 : B; /* a short last batch: the caches past count untouched */
    const int pos = r.between(0, ctx - B);
    s.param("batch", B);
    cuda_layer w = no_weights();
    w.wq = matrix(s, r, "wq", QD, D);
    w.wk = matrix(s, r, "wk", KVD, D);
    w.wv = matrix(s, r, "wv", KVD, D);
    if (MODEL_QKV_BIAS) {
        w.bq = s.in("bq", W_DTYPE, weights(r, QD, 0.5), {QD});
        w.bk = s.in("bk", W_DTYPE, weights(r, KVD, 0.5), {KVD});
        w.bv = s.in("bv", W_DTYPE, weights(r, KVD, 0.5), {KVD});
    }
    uint16_t *x_terms = s.in("x_terms", W_DTYPE, input_terms(r, B, D, 1.0), terms_shape(B, D));
    int *io = io_batch(s, pos, count);
    std::vector<uint16_t> kc = cache_words(r, ctx, 0.0f), vc = cache_words(r, ctx, 0.0f);
    uint16_t *kcd = s.in("key_cache", "f16", kc, cache_shape()), *vcd = s.in("value_cache", "f16", vc, cache_shape());
    std::vector<float> inv(model_rope_inv_freq, model_rope_inv_freq + HD / 2);
    s.input("rope_inv_freq", "f32", inv, {HD / 2});
    const int splits = qkv_split_count[size];
    s.param("splits", splits);
    float2 *part = s.upload(std::vector<float2>((size_t)splits * B * QKV_PAIRS, make_float2(NAN, NAN)));
    float *q = s.upload(poison_f32((size_t)B * QD));
    launch(prefill_qkv_gemm_kernel<B>, gemm_tiles(QKV_PAIRS), splits, GEMM_THREADS, GEMM_SMEM_BYTES(B), stream, w,
           (const uint16_t *)x_terms, part);
    launch(prefill_qkv_finish_kernel<B, kv_f16>, (QKV_PAIRS + 255) / 256, B, 256, 0, stream, w, (const float2 *)part, splits, q,
           f16_cache(kcd, vcd), (const int *)io, ctx);
    launched(s, "prefill_qkv_gemm_kernel + prefill_qkv_finish_kernel", gemm_tiles(QKV_PAIRS), splits, GEMM_THREADS, GEMM_SMEM_BYTES(B));
    s.out("q", "f32", q, (size_t)B * QD, {B, QD});
    s.out("key_cache_out", "f16", kcd, kc.size(), cache_shape());
    s.out("value_cache_out", "f16", vcd, vc.size(), cache_shape());
}

/* o_proj: the attention's output into terms, then the split GEMM (+ bias in split 0) */
template <int B>
static void stage_prefill_o(stage_rec &s, rng &r) {
    constexpr int size = prefill_size_index(B);
    s.param("batch", B);
    cuda_layer w = no_weights();
    w.wo = matrix(s, r, "wo", D, QD);
    if (MODEL_O_BIAS) w.bo = s.in("bo", W_DTYPE, weights(r, D, 0.5), {D});
    float *att = s.in("att", "f32", activations(r, (size_t)B * QD, 1.0), {B, QD});
    uint16_t *terms = s.upload(std::vector<uint16_t>((size_t)PREFILL_TERMS * B * QD, W_POISON));
    const int splits = o_split_count[size];
    s.param("splits", splits);
    float *part = s.upload(poison_f32((size_t)splits * B * D));
    launch(prefill_att_terms_kernel, (QD / 4 + 255) / 256, B, 256, 0, stream, (const float *)att, terms);
    launch(prefill_o_gemm_kernel<B>, gemm_tiles(D / 2), splits, GEMM_THREADS, GEMM_SMEM_BYTES(B), stream, w, (const uint16_t *)terms, part);
    launched(s, "prefill_att_terms_kernel + prefill_o_gemm_kernel", gemm_tiles(D / 2), splits, GEMM_THREADS, GEMM_SMEM_BYTES(B));
    s.out("att_terms", W_DTYPE, terms, (size_t)PREFILL_TERMS * B * QD, terms_shape(B, QD));
    s.out("part", "f32", part, (size_t)splits * B * D, {splits, B, D});
}

/* gate/up + SiLU in one of its forms (FORM: 0 prefill_pairs_body, 1 the cp.async GEMM, 2 and 3 the
 * TMA GEMM at one and two warpgroups a block), into down's input terms */
template <int B, int FORM>
static void stage_prefill_gate_up(stage_rec &s, rng &r) {
    s.param("batch", B);
    s.param("form", FORM);
    cuda_layer w = no_weights();
    w.w_gate = matrix(s, r, "w_gate", HID, D);
    w.w_up = matrix(s, r, "w_up", HID, D);
    uint16_t *x_terms = s.in("x_terms", W_DTYPE, input_terms(r, B, D, 1.0), terms_shape(B, D));
    uint16_t *hb_terms = s.upload(std::vector<uint16_t>((size_t)PREFILL_TERMS * B * HID, W_POISON));
    if constexpr (FORM == 0) {
        launch(prefill_gate_up_silu_kernel<B>, PREFILL_GRID(HID), 1, MV_THREADS, 0, stream, w, (const uint16_t *)x_terms, hb_terms);
        launched(s, "prefill_gate_up_silu_kernel", PREFILL_GRID(HID), 1, MV_THREADS, 0);
    } else if constexpr (FORM == 1) {
        launch(prefill_gate_up_gemm_kernel<B>, gemm_tiles(HID), 1, GEMM_THREADS, GEMM_SMEM_BYTES_AT(B, GATE_UP_GEMM_STAGES), stream, w,
               (const uint16_t *)x_terms, hb_terms);
        launched(s, "prefill_gate_up_gemm_kernel", gemm_tiles(HID), 1, GEMM_THREADS, GEMM_SMEM_BYTES_AT(B, GATE_UP_GEMM_STAGES));
    } else {
#if GEMM_TMA
        constexpr int WGS = FORM == 3 ? 2 : 1;
        const CUtensorMap gate = tensor_map_2d(w.w_gate, HID, D, 8), up = tensor_map_2d(w.w_up, HID, D, 8);
        const CUtensorMap in = tensor_map_2d(x_terms, PREFILL_TERMS * B, D, PREFILL_TERMS * B);
        launch(prefill_gate_up_tma_kernel<B, WGS>, TMA_BLOCKS(HID, WGS), 1, TMA_THREADS(B, WGS), TMA_SMEM_BYTES(B, TMA_STAGES(B, WGS), WGS),
               stream, gate, up, in, hb_terms);
        launched(s, "prefill_gate_up_tma_kernel", TMA_BLOCKS(HID, WGS), 1, TMA_THREADS(B, WGS), TMA_SMEM_BYTES(B, TMA_STAGES(B, WGS), WGS));
#else
        fail("no TMA form in this build");
#endif
    }
    s.out("hb_terms", W_DTYPE, hb_terms, (size_t)PREFILL_TERMS * B * HID, terms_shape(B, HID));
}

/* down as the split GEMM on gate/up's terms */
template <int B>
static void stage_prefill_down(stage_rec &s, rng &r) {
    constexpr int size = prefill_size_index(B);
    s.param("batch", B);
    cuda_layer w = no_weights();
    w.w_down = matrix(s, r, "w_down", D, HID);
    uint16_t *hb_terms = s.in("hb_terms", W_DTYPE, input_terms(r, B, HID, 1.0), terms_shape(B, HID));
    const int splits = down_split_count[size];
    s.param("splits", splits);
    float *part = s.upload(poison_f32((size_t)splits * B * D));
    launch(prefill_down_gemm_kernel<B>, gemm_tiles(D / 2), splits, GEMM_THREADS, GEMM_SMEM_BYTES(B), stream, w, (const uint16_t *)hb_terms,
           part);
    launched(s, "prefill_down_gemm_kernel", gemm_tiles(D / 2), splits, GEMM_THREADS, GEMM_SMEM_BYTES(B));
    s.out("part", "f32", part, (size_t)splits * B * D, {splits, B, D});
}

/* The prompt's attention for a batch at positions [pos, pos + count) over the cache [0, pos + count),
 * with the model's splits, launched as enqueue_prefill launches it: prefill_flash_kernel where the
 * plan has the flash form and the splits fit its combine, else prefill_attention_kernel
 * (attention_body's prefill). Its output att (count, q_dim); the counters put back. */
template <int B>
static void stage_prefill_attention(stage_rec &s, rng &r) {
    const int count = B > PREFILL_SMALL ? B - 1 : B; /* a short last batch: rows past count not written */
    const int pos = r.between(0, ctx - B);
    s.param("batch", B);
    s.param("n_splits", n_splits);
    s.param("ctx", ctx);
    float *q = s.in("q", "f32", activations(r, (size_t)B * QD, 1.0), {B, QD});
    int *io = io_batch(s, pos, count);
    uint16_t *kc = s.in("key_cache", "f16", cache_words(r, pos + count, 512.0f), cache_shape());
    uint16_t *vc = s.in("value_cache", "f16", cache_words(r, pos + count, 512.0f), cache_shape());
    float *part_acc = s.upload(poison_f32((size_t)B * MODEL_N_HEADS * n_splits * HD));
    float *part_ml = s.upload(poison_f32((size_t)B * MODEL_N_HEADS * n_splits * 2));
    unsigned *counters = s.upload(std::vector<unsigned>((size_t)B * NKV, 0u));
    float *att = s.upload(poison_f32((size_t)B * QD));
    bool flash = false;
#if PREFILL_FLASH_BUILT
    flash = MODEL_PREFILL_FLASH && n_splits <= FLASH_MAX_SPLITS(MODEL_HEAD_DIM);
    if (flash) {
        const size_t smem = FMMA_SMEM_BYTES(MODEL_HEAD_DIM);
        const dim3 grid = flash_grid<B>(n_splits);
        const prefill_flash_kernel_fn<B, kv_f16> kernel = prefill_flash<B, kv_f16>();
        SC(cudaFuncSetAttribute((const void *)kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        launch_grid(kernel, grid, FMMA_THREADS, smem, stream, (const float *)q, f16_cache(kc, vc), (const int *)io, part_acc,
                    part_ml, counters, att, ctx, n_splits);
        launched(s, "prefill_flash_kernel", grid.x * grid.y, grid.z, FMMA_THREADS, smem);
    }
#endif
    if (!flash) {
        const size_t smem = ATT_SMEM_BYTES(MODEL_KV_MUL * MODEL_PREFILL_ATT_TOKENS, MODEL_HEAD_DIM);
        SC(cudaFuncSetAttribute((const void *)prefill_attention_kernel<kv_f16>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        launch_grid(prefill_attention_kernel<kv_f16>, dim3(NKV, n_splits, B / MODEL_PREFILL_ATT_TOKENS), MODEL_ATT_THREADS, smem, stream,
                    (const float *)q, f16_cache(kc, vc), (const int *)io, part_acc, part_ml, counters, att, ctx, n_splits);
        launched(s, "prefill_attention_kernel", NKV * n_splits, B / MODEL_PREFILL_ATT_TOKENS, MODEL_ATT_THREADS, smem);
    }
    s.param("flash", flash ? 1 : 0);
    s.out("att", "f32", att, (size_t)count * QD, {count, QD});
    s.out("counters", "u32", counters, (size_t)B * NKV, {B * NKV});
}

/* attention_kernel past one split: depth from ATT_MIN_CHUNK on (the split tier's [0] graphs) */
static void run_attention(stage_rec &s, rng &r) {
    stage_attention(s, r, false, n_splits, r.between(std::min(ctx - 1, 2 * ATT_MIN_CHUNK), ctx - 1));
}
/* ... at a depth one split holds (every block but the first finds no positions) */
static void run_attention_one_split(stage_rec &s, rng &r) {
    stage_attention(s, r, false, n_splits, r.between(1, std::min(ctx, ATT_MIN_CHUNK) - 1));
}
#if MODEL_ATT_SHORT
/* attention_short_kernel as the [2] graphs launch it: short_kernel_splits a KV head, at a depth of
 * more than one split where it has several */
static void run_attention_short(stage_rec &s, rng &r) {
    const int sp = att_short_max(MODEL_HEAD_DIM), most = std::min(short_kernel_positions, ctx) - 1;
    const int pos = short_kernel_splits > 1 ? r.between(std::min(most, sp), most) : r.between(1, std::min(sp, ctx) - 1);
    stage_attention(s, r, true, short_kernel_splits, pos);
}
/* ... as the [3] graphs do: one split, at most att_short_max positions */
static void run_attention_short_one_split(stage_rec &s, rng &r) {
    stage_attention(s, r, true, 1, r.between(1, std::min(att_short_max(MODEL_HEAD_DIM), ctx) - 1));
}
#endif

static const stage_def stages[] = {
    {"embed", stage_embed},
    {"rmsnorm_qkv_rope", stage_qkv},
    {"attention", run_attention},
    {"attention_one_split", run_attention_one_split},
#if MODEL_ATT_SHORT
    {"attention_short", run_attention_short},
    {"attention_short_one_split", run_attention_short_one_split},
#endif
    {"o_proj_residual", stage_o_proj<false>},
    {"o_proj_residual_shortest", stage_o_proj<true>},
    {"rmsnorm_gate_up_silu", stage_gate_up},
    {"down_residual", stage_down},
#if MODEL_MLP_FUSED
    {"transpose_down", stage_transpose},
    {"mlp_fused", stage_mlp_fused},
#endif
    {"rmsnorm_lm_head_argmax", stage_lm_head},
#define PREFILL_STAGES(B, tag)                                                                     \
    {"prefill_rms_" tag, stage_prefill_rms<B>}, {"prefill_qkv_" tag, stage_prefill_qkv<B>},         \
        {"prefill_o_proj_" tag, stage_prefill_o<B>}, {"prefill_gate_up_pairs_" tag, stage_prefill_gate_up<B, 0>}, \
        {"prefill_gate_up_gemm_" tag, stage_prefill_gate_up<B, 1>}, {"prefill_down_" tag, stage_prefill_down<B>}, \
        {"prefill_attention_" tag, stage_prefill_attention<B>}
    PREFILL_STAGES(PREFILL_SMALL, "small"),
    PREFILL_STAGES(PREFILL_BATCH, "full"),
#if GEMM_TMA
    {"prefill_gate_up_tma_small", stage_prefill_gate_up<PREFILL_SMALL, 2>},
    {"prefill_gate_up_tma_full", stage_prefill_gate_up<PREFILL_BATCH, 2>},
    {"prefill_gate_up_tma_wide_small", stage_prefill_gate_up<PREFILL_SMALL, 3>},
    {"prefill_gate_up_tma_wide_full", stage_prefill_gate_up<PREFILL_BATCH, 3>},
#endif
#undef PREFILL_STAGES
};
#define N_STAGES (int)(sizeof stages / sizeof *stages)

// ---------------------------------------------------------------------------------------------
// The manifest

static void write_manifest(uint64_t seed) {
    const std::string path = out_dir + "/manifest.json";
    FILE *f = fopen(path.c_str(), "w");
    if (!f) {
        fprintf(stderr, "cuda_stage_test: %s: cannot write\n", path.c_str());
        exit(1);
    }
    fprintf(f, "{\n  \"seed\": %llu,\n  \"device\": \"%s\",\n  \"sms\": %d,\n  \"ctx\": %d,\n  \"n_splits\": %d,\n",
            (unsigned long long)seed, prop.name, sms, ctx, n_splits);
    fprintf(f, "  \"weight_dtype\": \"%s\",\n", W_DTYPE);
    fprintf(f, "  \"model\": {\"dim\": %d, \"hidden_dim\": %d, \"n_heads\": %d, \"n_kv_heads\": %d, \"head_dim\": %d, "
               "\"q_dim\": %d, \"kv_dim\": %d, \"vocab_size\": %d, \"norm_eps\": %.9g, \"qkv_bias\": %d, \"o_bias\": %d},\n",
            D, HID, MODEL_N_HEADS, NKV, HD, QD, KVD, VOCAB, (double)MODEL_NORM_EPS, (int)MODEL_QKV_BIAS, (int)MODEL_O_BIAS);
    fprintf(f, "  \"plan\": {\"att_mma_hd\": %d, \"att_short\": %d, \"att_o_short\": %d, \"att_o_poll\": %d, \"down_poll\": %d, "
               "\"mlp_fused\": %d, \"residual_pairs\": %d, \"att_min_chunk\": %d, \"att_short_max\": %d, "
               "\"short_kernel_splits\": %d, \"short_kernel_positions\": %d, \"grid_mlp\": %d, \"att_poll_word\": %u, "
               "\"prefill_terms\": %d, \"gemm_tma\": %d},\n",
            (int)MODEL_ATT_MMA_HD, (int)MODEL_ATT_SHORT, (int)MODEL_ATT_O_SHORT, (int)MODEL_ATT_O_POLL, (int)MODEL_DOWN_POLL,
            (int)MODEL_MLP_FUSED, (int)MODEL_RESIDUAL_PAIRS, (int)ATT_MIN_CHUNK,
#if MODEL_ATT_SHORT
            att_short_max(MODEL_HEAD_DIM),
#else
            0,
#endif
            short_kernel_splits, short_kernel_positions, grid_mlp, ATT_POLL_WORD, PREFILL_TERMS, (int)GEMM_TMA);
    fprintf(f, "  \"stages\": {");
    for (size_t i = 0; i < done_stages.size(); i++) {
        const stage_rec &s = done_stages[i];
        fprintf(f, "%s\n    \"%s\": {\"kernel\": \"%s\", \"grid\": [%d, %d], \"block\": %d, \"smem\": %zu, \"params\": {", i ? "," : "",
                s.name.c_str(), s.kernel.c_str(), s.grid_x, s.grid_y, s.block, s.smem);
        for (size_t k = 0; k < s.params.size(); k++)
            fprintf(f, "%s\"%s\": %lld", k ? ", " : "", s.params[k].first.c_str(), s.params[k].second);
        fprintf(f, "},\n      \"arrays\": {");
        for (size_t a = 0; a < s.arrays.size(); a++) {
            const array_rec &ar = s.arrays[a];
            fprintf(f, "%s\n        \"%s\": {\"file\": \"%s.%s.bin\", \"dtype\": \"%s\", \"output\": %s, \"shape\": [", a ? "," : "",
                    ar.name.c_str(), s.name.c_str(), ar.name.c_str(), ar.dtype.c_str(), ar.output ? "true" : "false");
            for (size_t d = 0; d < ar.shape.size(); d++) fprintf(f, "%s%lld", d ? ", " : "", ar.shape[d]);
            fprintf(f, "]}");
        }
        fprintf(f, "}}");
    }
    fprintf(f, "\n  }\n}\n");
    if (fclose(f) != 0) {
        fprintf(stderr, "cuda_stage_test: %s: cannot write\n", path.c_str());
        exit(1);
    }
}

static int usage(void) {
    fprintf(stderr, "usage: cuda_stage_test --list\n       cuda_stage_test OUTDIR SEED [--stage NAME]... [--ctx N]\n");
    return 2;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "--list") == 0) {
        for (int i = 0; i < N_STAGES; i++) printf("%s\n", stages[i].name);
        return 0;
    }
    if (argc < 3) return usage();
    out_dir = argv[1];
    char *end;
    const uint64_t seed = strtoull(argv[2], &end, 10);
    if (*end) return usage();
    std::vector<const char *> only;
    ctx = 2048;
    for (int i = 3; i < argc; i++) {
        if (strcmp(argv[i], "--stage") == 0 && i + 1 < argc) only.push_back(argv[++i]);
        else if (strcmp(argv[i], "--ctx") == 0 && i + 1 < argc) ctx = atoi(argv[++i]);
        else return usage();
    }
    if (ctx < 2 * ATT_MIN_CHUNK + 1) {
        fprintf(stderr, "cuda_stage_test: --ctx %d: at least %d (attention past one split)\n", ctx, 2 * ATT_MIN_CHUNK + 1);
        return 2;
    }
    for (const char *name : only) {
        bool known = false;
        for (int i = 0; i < N_STAGES; i++) known |= strcmp(stages[i].name, name) == 0;
        if (!known) {
            fprintf(stderr, "cuda_stage_test: no stage %s in this build (--list)\n", name);
            return 2;
        }
    }
    mkdir(out_dir.c_str(), 0755); /* may exist */
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        fprintf(stderr, "cuda_stage_test: no CUDA device\n");
        return 1;
    }
    init_like_model();
    for (int i = 0; i < N_STAGES; i++) {
        bool want = only.empty();
        for (const char *name : only) want |= strcmp(stages[i].name, name) == 0;
        if (!want) continue;
        current_stage = stages[i].name;
        printf("stage %s\n", current_stage);
        fflush(stdout);
        stage_rec s;
        s.name = stages[i].name;
        rng r = stage_rng(seed, stages[i].name);
        stages[i].run(s, r);
        s.free_all();
        done_stages.push_back(s);
    }
    current_stage = "(manifest)";
    write_manifest(seed);
    SC(cudaStreamDestroy(stream));
    return 0;
}
#endif
