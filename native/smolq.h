/* smolq.h: the C ABI of the llm-smolq kernel.
 *
 * cffi reads this file as its cdef, so it holds declarations only: no includes, no
 * macros (the builder drops lines starting with '#'). Shapes are written
 * [outer][inner]; the last index is contiguous in memory.
 *
 * The kernel's files, each one role:
 *   forward.c            a batch of tokens through every layer (sq_forward)
 *   attention.c/.h       attention over an F32 cache, in llama.cpp's one-token order
 *   flash_attention.c/.h attention over the F16 and Q8_0 caches, in one pass
 *   flash_attention_x16.c  its prefill step in 512-bit registers (AVX-512 CPUs)
 *   matmul.c/.h          weight matrices times activations, on the pool
 *   pool.c/.h            the worker threads
 *   threads.h            the threading calls pool.c makes, on pthreads or Win32
 *   read_bandwidth.c     the pool's threads reading a buffer: the wall decode runs against
 *   int8_peak.c          the pool's threads multiplying bytes: the wall a prompt runs against
 *   exp_ggml.h           llama.cpp's exp, for softmax and SiLU
 *   simd.h               SIMD build flags, CPU checks, code compiled twice, horizontal sums
 *   cpu_x86.c            the x86-64 CPU checks, from CPUID and XGETBV; Linux's grant of AMX tiles
 *   simd512.h            sixteen-lane registers, or SIMDe's stand-ins in the test build
 *   quants/              the tensor types: the list and the definition of their products
 *                        (types.h), block layouts, the scalar definition in code, dispatch,
 *                        the packed layout (rows16.c), and the x86/ and arm/ kernels
 *                        (quants/kernels.h)
 */
#ifndef SMOLQ_H
#define SMOLQ_H
#include <stdint.h>

/* GGUF tensor types the kernel reads, numbered as in the GGUF file format.
 * Q8_1 and Q8_K only ever hold activations (see sq_vec_dot_type). */
enum sq_type {
    SQ_F32 = 0, SQ_F16 = 1, SQ_Q4_0 = 2, SQ_Q4_1 = 3, SQ_Q5_0 = 6, SQ_Q5_1 = 7,
    SQ_Q8_0 = 8, SQ_Q8_1 = 9, SQ_Q2_K = 10, SQ_Q3_K = 11, SQ_Q4_K = 12, SQ_Q5_K = 13,
    SQ_Q6_K = 14, SQ_Q8_K = 15, SQ_IQ4_NL = 20, SQ_IQ4_XS = 23, SQ_BF16 = 30
};

/* The GGUF type ids of every type the kernel reads as weights (F32, F16, BF16 and the
 * quantized types; not Q8_1 or Q8_K, which only hold activations): the first cap of
 * them go to out (which may be NULL when cap is 0). Returns how many there are. */
int sq_weight_types(int *out, int cap);

/* The GGUF name of a type the kernel knows ("Q4_K", "IQ4_XS", ...), or NULL. */
const char *sq_type_name(int type);

/* Block geometry of a type: elements per block and bytes per block; 0 if unknown. */
int sq_block_elems(int type);
int sq_block_bytes(int type);

/* Decode n elements (a whole number of blocks) of a row of `type` into dst.
 * Returns 0, or -1 for an unknown type or an n that is not a whole number of blocks. */
int sq_dequantize_row(int type, const void *src, float *dst, int64_t n);

/* Dot product of n elements of a row of `type` with float activations x,
 * accumulated without quantizing x. Same preconditions as sq_dequantize_row;
 * returns NaN where it would return -1. */
float sq_dot_row(int type, const void *row, const float *x, int64_t n);

/* The engine's mat-vecs work as llama.cpp's CPU backend does: the activations are first
 * converted to the format paired with the weight type (Q8_0 for Q4_0/Q5_0/Q8_0/IQ4_NL,
 * Q8_1 for Q4_1/Q5_1, Q8_K for the K-quants and IQ4_XS, F16/BF16/F32 for the float
 * types), then multiplied block by block in integer arithmetic, with one float step per
 * block (quants/types.h). -1 for an unknown type. */
int sq_vec_dot_type(int type);

/* Convert n floats into blocks of vec_type (Q8_0, Q8_1, Q8_K, F16, BF16 or F32) at dst;
 * n must be a whole number of its blocks. Returns 0, or -1 as sq_dequantize_row does. */
int sq_quantize_row(int vec_type, const float *x, void *dst, int64_t n);

/* A row of activations as the mat-vecs below take it: sq_quantize_row's blocks, and after
 * them for Q8_0 each block's offset and its d as a float, for Q8_1 each block's d and s as
 * floats, for Q8_K its sums of 32 codes (quants/blocks.h: sq_q8_0_offsets_at,
 * sq_q8_0_scales_at, sq_q8_1_scales_at, sq_q8_K_sums32_at), which the packed kernels read
 * (sq_vec_dot_rows16).
 * sq_activation_row_bytes: its size in bytes, or -1 where sq_quantize_row would fail;
 * sq_quantize_activations writes it (0, or -1). */
int64_t sq_activation_row_bytes(int vec_type, int64_t n);
int sq_quantize_activations(int vec_type, const float *x, void *dst, int64_t n);

/* Dot product of n elements of a weight row of `type` with activations xq already in
 * sq_vec_dot_type(type) format: the engine's arithmetic, whose bits every other form
 * below (and every SIMD path) gives. Returns NaN on the error cases of
 * sq_dequantize_row. */
float sq_vec_dot(int type, const void *row, const void *xq, int64_t n);

/* A weight row times n_tokens activation rows (xq_stride bytes apart, each as for
 * sq_vec_dot): y[t * ldy] = row . xq row t, each exactly sq_vec_dot's value.
 * Returns 0, or -1 on the error cases of sq_vec_dot (y untouched). */
int sq_vec_dot_batch(int type, const void *row, const void *xq, int64_t xq_stride, int n_tokens, int64_t n,
                     float *y, int64_t ldy);

/* n_rows weight rows (row_bytes apart) times one activation row, as for sq_vec_dot:
 * y[r] = row r . xq, each exactly sq_vec_dot's value; a mat-vec's rows in one call, the
 * kernel chosen once. Returns 0, or -1 as sq_vec_dot_batch. */
int sq_vec_dot_rows(int type, const void *rows, int64_t row_bytes, int64_t n_rows, const void *xq, int64_t n,
                    float *y);

/* n_rows weight rows (row_bytes apart) times n_tokens activation rows: y[t * ldy + r] =
 * row r . xq row t, each exactly sq_vec_dot's value; every row read once for all the
 * tokens, several rows sharing a pass over the activations where a kernel takes them.
 * Returns 0, or -1 as sq_vec_dot_batch. */
int sq_vec_dot_batch_rows(int type, const void *rows, int64_t row_bytes, int64_t n_rows, const void *xq,
                          int64_t xq_stride, int n_tokens, int64_t n, float *y, int64_t ldy);

/* The kernel paths in use, chosen on first use: "avx512vnni" on x86-64 when the CPU
 * has AVX-512 VNNI, VL and BW besides AVX2, FMA and F16C (AVX-512 VNNI versions of every
 * quantized dot product; the batched ones and attention as on "avx2"), "avx2" on x86-64
 * when the CPU has AVX2, FMA and F16C (AVX2/FMA versions of every quantized dot product,
 * the batched ones and attention), "neon" on arm64 (NEON versions of every quantized dot
 * product, one token's and a batch's), or "scalar". The environment variable
 * SMOLQ_SIMD set to "0" starts with "scalar", set to "avx2" keeps to "avx2" on a CPU
 * with AVX-512 VNNI. Every path gives the same bits. */
const char *sq_simd_name(void);

/* Switch between the SIMD (enabled != 0: AVX-512 VNNI, AVX2 or NEON, the best the CPU
 * has, but AVX2 under SMOLQ_SIMD=avx2) and scalar vec_dot functions; enabling only
 * takes effect on a CPU that supports them (every arm64 CPU does).
 * Returns the previous setting (1 or 0). Safe at any time: a dot product already
 * running finishes with the set it started on. */
int sq_set_simd(int enabled);

/* gate[i] = SiLU(gate[i]) * up[i] for i < n, rounded as llama.cpp's fused SwiGLU (its
 * exp, exp_ggml.h), on the SIMD path in use or the plain one: the same bits. */
void sq_swiglu(float *gate, const float *up, int64_t n);

/* Weight matrices packed sixteen rows side by side (quants/rows16.c), for the 512-bit
 * kernels: a group of sixteen rows takes the bytes its rows took, its blocks interleaved
 * as those kernels load them. sq_rows16_packs: 1 for the types that pack (Q4_1, Q8_0,
 * Q4_K, Q6_K), else 0. sq_rows16_pack writes the packed form of a matrix of rows (a
 * multiple of 16) rows of cols elements (whole blocks), contiguous at src, to dst (as many
 * bytes, not overlapping src); sq_rows16_unpack does the reverse. 0, or -1 for anything
 * else (dst untouched). sq_rows16_wanted: 1 when the kernels in use read packed matrices
 * of that type faster (every packable type on the "avx512vnni" path, Q4_K on "avx2");
 * any path reads them, with the same bits. */
int sq_rows16_packs(int type);
int sq_rows16_pack(int type, const void *src, void *dst, int64_t rows, int64_t cols);
int sq_rows16_unpack(int type, const void *src, void *dst, int64_t rows, int64_t cols);
int sq_rows16_wanted(int type);

/* Rows r0..r1-1 of a matrix packed by sq_rows16_pack whose row 0 is at data, times
 * n_tokens activation rows as sq_quantize_activations writes them, xq_stride bytes apart:
 * y[t * ldy + r - r0], each exactly sq_vec_dot's value for the row as the file had it.
 * Returns 0, or -1 on its error cases, a type that does not pack, r1 < r0, n_tokens < 1
 * or a stride below sq_activation_row_bytes (with more than one token). */
int sq_vec_dot_rows16(int type, const void *data, int64_t r0, int64_t r1, const void *xq, int64_t xq_stride,
                      int n_tokens, int64_t n, float *y, int64_t ldy);

/* Row r (0..15) of a packed group, decoded as sq_dequantize_row decodes the row it was. */
int sq_dequantize_row16(int type, const void *group, int r, float *dst, int64_t n);

/* A weight matrix as a view into the mapped GGUF file (never copied), or into the
 * engine's packed copy of it (sq_rows16_pack). */
typedef struct {
    const void *data;      /* first byte of row 0 */
    int type;              /* enum sq_type */
    int64_t rows;          /* output features (GGUF ne[1]); 1 for a vector */
    int64_t cols;          /* input features (GGUF ne[0]), contiguous */
    int64_t row_bytes;     /* bytes from one row to the next */
    int packed16;          /* 1: sixteen rows side by side (sq_rows16_pack) */
} sq_tensor;

/* Rows r0..r1-1 of a weight matrix, in whichever layout it has, times n_tokens activation
 * rows (as for sq_vec_dot_batch_rows, xq_stride bytes apart; one token's needs no stride):
 * y[t * ldy + r - r0], each exactly sq_vec_dot's value; the kernels ask memory ahead for
 * the rows up to fetch_end, those the thread goes on to next (matmul.c). Returns 0, or -1
 * unless 0 <= r0 <= r1 <= fetch_end <= w->rows and n_tokens >= 1, and as the row functions
 * above. */
int sq_vec_dot_matrix_rows(const sq_tensor *w, int64_t r0, int64_t r1, int64_t fetch_end, const void *xq,
                           int64_t xq_stride, int n_tokens, float *y, int64_t ldy);

typedef struct {
    sq_tensor attn_norm;   /* [dim] f32 */
    sq_tensor wq;          /* [n_heads*head_dim][dim], rows permuted for adjacent-pair RoPE */
    sq_tensor wk;          /* [n_kv_heads*head_dim][dim], likewise */
    sq_tensor wv;          /* [n_kv_heads*head_dim][dim] */
    sq_tensor wo;          /* [dim][n_heads*head_dim] */
    sq_tensor ffn_norm;    /* [dim] f32 */
    sq_tensor ffn_gate;    /* [hidden_dim][dim] */
    sq_tensor ffn_up;      /* [hidden_dim][dim] */
    sq_tensor ffn_down;    /* [dim][hidden_dim] */
    int use_rope;          /* 0 on SmolLM3's NoPE layers */
} sq_layer;

typedef struct {
    int dim;               /* residual stream width */
    int hidden_dim;        /* FFN width */
    int n_layers;
    int n_heads;           /* query heads */
    int n_kv_heads;        /* key/value heads (GQA groups) */
    int head_dim;
    int vocab_size;
    int n_ctx;             /* positions the KV cache holds */
    float rope_theta;      /* RoPE base frequency */
    float rms_eps;
    /* YaRN, as llama.cpp applies it (all 0 without scaling): angles of the pairs past
     * the ramp's corner dimensions interpolated by yarn_freq_scale (1 / the factor), and
     * cos and sin scaled by 1 + 0.1 ln(factor). */
    float yarn_freq_scale;  /* 1 / factor; 0: no scaling */
    int yarn_orig_ctx;      /* positions the model was trained for */
    float yarn_beta_fast;   /* rotations per window past which a pair is kept as trained (32) */
    float yarn_beta_slow;   /* ... below which it is interpolated (1) */
} sq_config;

typedef struct {
    sq_config cfg;
    sq_tensor token_embd;  /* [vocab_size][dim] */
    sq_tensor output_norm; /* [dim] f32 */
    sq_tensor output;      /* [vocab_size][dim]; token_embd when embeddings are tied */
    sq_layer *layers;      /* [n_layers] */
} sq_model;

/* A persistent pool of worker threads; the calling thread is worker 0. */
typedef struct sq_pool sq_pool;
sq_pool *sq_pool_new(int n_threads);
int sq_pool_threads(const sq_pool *pool);
void sq_pool_free(sq_pool *pool);
/* Read bytes at p (8-byte aligned) with every thread of the pool, each its contiguous
 * share, and return a checksum of them: the read bandwidth decode runs against. */
uint64_t sq_read_all(sq_pool *pool, const void *p, int64_t bytes);
/* Run `rounds` rounds of the SIMD setting's int8 multiply-add instruction on every thread
 * of the pool, every byte pair a * b (a in 0..127, b in -64..63), and return how many
 * multiply-adds were done (-1 for arguments out of range): their rate is the int8 peak a
 * prompt's matrix products run against. checksum: the sum of every int32 lane's value as
 * an unsigned 32-bit number: a * b times the multiply-adds, while no lane passes 2^31. */
int64_t sq_int8_peak(sq_pool *pool, int64_t rounds, int a, int b, uint64_t *checksum);

/* Activation buffers for batches of up to max_batch tokens. */
typedef struct sq_state sq_state;
sq_state *sq_state_new(const sq_config *cfg, int max_batch);
void sq_state_free(sq_state *s);
/* Bytes an sq_state holds once sq_forward has run it on a pool of n_threads: what
 * sq_state_new allocates plus each thread's attention scratch (not the KV cache). */
int64_t sq_state_bytes(const sq_config *cfg, int max_batch, int n_threads);

/* Run tokens[0..n_tokens) at positions n_past.. through every layer.
 * k_cache, v_cache: [n_layers][n_kv_heads][n_ctx][row] where a row is head_dim values of
 * kv_type: SQ_F32 (llama.cpp's one-token attention order), SQ_F16 or SQ_Q8_0 (head_dim /
 * 32 blocks; both attend in one online-softmax pass); the new positions are written there.
 * flags (sq_forward_flags, or-ed): SQ_ALL_LOGITS gives logits [n_tokens][vocab_size],
 * else [vocab_size] for the last token. Every token's row is the same bits whatever batch
 * it comes in: a batch gives the logits of as many one-token steps, so drafts verified
 * in one pass decode exactly as plain decoding does, the weights read once.
 * Returns 0, or a negative sq_error. */
enum sq_error { SQ_OK = 0, SQ_ERR_ARGS = -1, SQ_ERR_TOKEN = -2, SQ_ERR_CONTEXT = -3 };
enum sq_forward_flags { SQ_ALL_LOGITS = 1 };
int sq_forward(const sq_model *m, sq_state *s, sq_pool *pool,
               void *k_cache, void *v_cache, int kv_type,
               const int32_t *tokens, int n_tokens, int n_past,
               float *logits, int flags);

/* One decode step of grouped-query attention over positions 0..n_keys-1, as sq_forward
 * computes it for a cache of kv_type (SQ_F32, SQ_F16 or SQ_Q8_0).
 * q: [n_heads][head_dim] f32; k_cache, v_cache: [n_kv_heads][n_ctx][row] of kv_type;
 * out: [n_heads][head_dim]. Query head h reads KV head h / (n_heads / n_kv_heads);
 * scores are scaled by 1/sqrt(head_dim). Arguments out of range fill out with NaN. */
void sq_attention(const float *q, const void *k_cache, const void *v_cache, int kv_type,
                  int n_heads, int n_kv_heads, int n_ctx, int head_dim, int n_keys,
                  float *out);

#endif
