/* RoPE: inv_freq and the attention factor as transformers' modeling_rope_utils.py computes
 * them, and the cos/sin tables (DESIGN.md section 3).
 *
 * transformers computes inv_freq with fp32 tensors and Python-double scalars. Each step
 * below reproduces one line, with torch's semantics spelled out:
 *   - a Python scalar meeting an fp32 tensor is cast to fp32 first, then one fp32 operation;
 *   - `s / t` is Tensor.__rtruediv__, which torch defines as `t.reciprocal() * s`: two fp32
 *     roundings, not one division;
 *   - `base ** t` is an fp32 pow; here (float)pow((double)base, (double)t), which is
 *     correctly rounded but for rare double-rounding cases (torch's vectorised powf is within
 *     1 ulp of it);
 *   - Python arithmetic on scalars (get_mscale, find_correction_dim) is double.
 * Every operation is written as its own statement and the library is built with
 * -ffp-contract=off, so no multiply-add is fused. */
#include <math.h>
#include <string.h>

#include "base/alloc.h"
#include "base/errors.h"
#include "base/floats.h"
#include "config.h"
#include "rope.h"

/* math.pi */
static const double PI = 3.141592653589793;

/* base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim): the fp32 exponent
 * (2i as fp32, divided by dim in fp32), then the fp32 power. */
static float pos_freq(float base, uint32_t i, uint32_t dim) {
    float exponent = (float)(2 * i) / (float)dim;
    return (float)pow((double)base, (double)exponent);
}

/* `1.0 / x` on a tensor: x.reciprocal() * 1.0, the multiply being exact. */
static float recip(float x) { return 1.0f / x; }

/* _compute_yarn_parameters.get_mscale, in double. */
static double get_mscale(double scale, double mscale) {
    if (scale <= 1.0) return 1.0;
    return 0.1 * mscale * log(scale) + 1.0;
}

/* _compute_yarn_parameters.find_correction_dim, in double:
 *   (dim * math.log(max_position_embeddings / (num_rotations * 2 * math.pi)))
 *       / (2 * math.log(base)) */
static double find_correction_dim(double num_rotations, double dim, double base, double max_pos) {
    return (dim * log(max_pos / (num_rotations * 2.0 * PI))) / (2.0 * log(base));
}

static void inv_freq_llama3(const parity_config *c, float *inv_freq, uint32_t half) {
    /* factor, low_freq_factor, high_freq_factor, old_context_len as Python numbers. */
    double factor = c->rope_factor, low_ff = c->rope_low_freq_factor;
    double high_ff = c->rope_high_freq_factor;
    double old_context_len = c->rope_original_max_position_embeddings;
    /* low_freq_wavelen = old_context_len / low_freq_factor (double); compared with the fp32
     * wavelen after a cast to fp32 (torch.where(wavelen > low_freq_wavelen, ...)). */
    float low_freq_wavelen = (float)(old_context_len / low_ff);
    float high_freq_wavelen = (float)(old_context_len / high_ff);
    float two_pi = (float)(2.0 * PI);
    for (uint32_t i = 0; i < half; i++) {
        float inv = inv_freq[i];
        /* wavelen = 2 * math.pi / inv_freq  ->  inv_freq.reciprocal() * (float)(2 pi) */
        float wavelen = recip(inv) * two_pi;
        /* inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq) */
        float inv_llama = wavelen > low_freq_wavelen ? inv / (float)factor : inv;
        /* smooth_factor = (old_context_len / wavelen - low_freq_factor)
         *                 / (high_freq_factor - low_freq_factor) */
        float smooth = recip(wavelen) * (float)old_context_len;
        smooth = smooth - (float)low_ff;
        smooth = smooth / (float)(high_ff - low_ff);
        /* smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor
         *                     + smooth_factor * inv_freq_llama */
        float a = 1.0f - smooth;
        a = a * inv_llama;
        a = a / (float)factor;
        float b = smooth * inv_llama;
        float smoothed = a + b;
        /* is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
         * inv_freq_llama = torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama) */
        int medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
        inv_freq[i] = medium ? smoothed : inv_llama;
    }
}

static void inv_freq_yarn(const parity_config *c, float *inv_freq, float *attention_factor) {
    uint32_t dim = c->head_dim, half = dim / 2;
    double base = c->rope_theta;
    double factor = c->rope_factor;
    /* Sets the attention factor as suggested in the paper:
     *   if attention_factor is None:
     *       if mscale and mscale_all_dim:
     *           attention_factor = float(get_mscale(factor, mscale)
     *                                    / get_mscale(factor, mscale_all_dim))
     *       else:
     *           attention_factor = get_mscale(factor)
     * then `cos * attention_scaling` casts it to fp32. */
    double att;
    if (c->rope_attention_factor > 0.0f)
        att = c->rope_attention_factor;
    else if (c->rope_mscale != 0.0f && c->rope_mscale_all_dim != 0.0f)
        att = get_mscale(factor, c->rope_mscale) / get_mscale(factor, c->rope_mscale_all_dim);
    else
        att = get_mscale(factor, 1.0);
    *attention_factor = (float)att;

    /* low, high = find_correction_range(beta_fast, beta_slow, dim, base,
     *                                   original_max_position_embeddings, truncate):
     *   low = find_correction_dim(low_rot, ...); high = find_correction_dim(high_rot, ...)
     *   if truncate: low = math.floor(low); high = math.ceil(high)
     *   return max(low, 0), min(high, dim - 1) */
    double max_pos = c->rope_original_max_position_embeddings;
    double low = find_correction_dim(c->rope_beta_fast, dim, base, max_pos);
    double high = find_correction_dim(c->rope_beta_slow, dim, base, max_pos);
    if (c->rope_truncate) {
        low = floor(low);
        high = ceil(high);
    }
    if (low < 0.0) low = 0.0;
    if (high > (double)(dim - 1)) high = (double)(dim - 1);
    /* linear_ramp_factor(min, max, dim // 2):
     *   if min == max: max += 0.001
     *   linear_func = (torch.arange(dim, dtype=torch.float32) - min) / (max - min)
     *   ramp_func = torch.clamp(linear_func, 0, 1) */
    if (low == high) high += 0.001;
    float ramp_min = (float)low;
    float ramp_den = (float)(high - low);

    float fbase = (float)base;
    for (uint32_t i = 0; i < half; i++) {
        /* pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim) */
        float pos = pos_freq(fbase, i, dim);
        /* inv_freq_extrapolation = 1.0 / pos_freqs */
        float extrapolation = recip(pos);
        /* inv_freq_interpolation = 1.0 / (factor * pos_freqs) */
        float scaled = (float)factor * pos;
        float interpolation = recip(scaled);
        float ramp = (float)i - ramp_min;
        ramp = ramp / ramp_den;
        ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
        /* inv_freq_extrapolation_factor = 1 - linear_ramp_factor(low, high, dim // 2) */
        float extrapolation_factor = 1.0f - ramp;
        /* inv_freq = inv_freq_interpolation * (1 - inv_freq_extrapolation_factor)
         *            + inv_freq_extrapolation * inv_freq_extrapolation_factor */
        float interpolation_weight = 1.0f - extrapolation_factor;
        float a = interpolation * interpolation_weight;
        float b = extrapolation * extrapolation_factor;
        inv_freq[i] = a + b;
    }
}

/* _compute_default_rope_parameters:
 *   inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)) */
void rope_default_inv_freq(float base, uint32_t dim, float *inv_freq) {
    for (uint32_t i = 0; i < dim / 2; i++) inv_freq[i] = recip(pos_freq(base, i, dim));
}

int rope_inv_freq(const parity_config *c, float *inv_freq, float *attention_factor) {
    if (!c || !inv_freq || !attention_factor)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "rope_inv_freq: NULL argument");
    TRY(config_validate(c));
    uint32_t dim = c->head_dim, half = dim / 2;
    *attention_factor = 1.0f;
    if (c->rope_type == PARITY_ROPE_YARN) {
        inv_freq_yarn(c, inv_freq, attention_factor);
        return PARITY_OK;
    }
    /* The Python base meets an fp32 tensor, so it is cast to fp32. */
    rope_default_inv_freq((float)c->rope_theta, dim, inv_freq);
    if (c->rope_type == PARITY_ROPE_LINEAR) {
        /* _compute_linear_scaling_rope_parameters: inv_freq /= factor (fp32) */
        for (uint32_t i = 0; i < half; i++) inv_freq[i] = inv_freq[i] / c->rope_factor;
    } else if (c->rope_type == PARITY_ROPE_LLAMA3) {
        inv_freq_llama3(c, inv_freq, half);
    }
    return PARITY_OK;
}

/* The rotary embedding's forward:
 *   freqs = (inv_freq_expanded.float() @ position_ids_expanded.float())  -- K = 1: one
 *           fp32 product per element
 *   cos = emb.cos() * self.attention_scaling; sin = emb.sin() * self.attention_scaling
 *   return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)
 * cos/sin of the fp32 angle are evaluated in double and rounded to fp32. */
void rope_cos_sin(const float *inv_freq, uint32_t half, uint32_t pos, float attention_factor,
                  float *cos_out, float *sin_out) {
    float fpos = (float)pos;
    for (uint32_t i = 0; i < half; i++) {
        float angle = fpos * inv_freq[i];
        float cv = (float)cos((double)angle);
        float sv = (float)sin((double)angle);
        if (attention_factor != 1.0f) {
            cv = cv * attention_factor;
            sv = sv * attention_factor;
        }
        cos_out[i] = cv;
        sin_out[i] = sv;
    }
}

void rope_tables_free(rope_tables *t) {
    if (!t) return;
    px_free(t->cos_f32);
    px_free(t->sin_f32);
    px_free(t->cos_bf16);
    px_free(t->sin_bf16);
    px_free(t->cos_fp16);
    px_free(t->sin_fp16);
    memset(t, 0, sizeof *t);
}

int rope_tables_build(const parity_config *c, uint32_t n_positions, rope_tables *t) {
    if (!c || !t) return set_error(PARITY_ERR_INVALID_ARGUMENT, "rope_tables_build: NULL argument");
    if (n_positions < 1 || n_positions > (1u << 24))
        return set_error(PARITY_ERR_INVALID_ARGUMENT,
                         "rope_tables_build: %u positions, must be in 1..2^24 (exact as fp32)",
                         n_positions);
    TRY(config_validate(c));
    uint32_t half = c->head_dim / 2;
    float *inv_freq = px_malloc((size_t)half * sizeof(float), "RoPE inv_freq");
    if (!inv_freq) return PARITY_ERR_OUT_OF_MEMORY;
    float attention_factor;
    const int rc = rope_inv_freq(c, inv_freq, &attention_factor);
    if (rc) {
        px_free(inv_freq);
        return rc;
    }

    rope_tables r = {n_positions, half, NULL, NULL, NULL, NULL, NULL, NULL};
    size_t n = (size_t)n_positions * half;
    r.cos_f32 = px_calloc(n, sizeof(float), "RoPE cos table");
    r.sin_f32 = r.cos_f32 ? px_calloc(n, sizeof(float), "RoPE sin table") : NULL;
    r.cos_bf16 = r.sin_f32 ? px_calloc(n, sizeof(float), "RoPE bf16 cos table") : NULL;
    r.sin_bf16 = r.cos_bf16 ? px_calloc(n, sizeof(float), "RoPE bf16 sin table") : NULL;
    r.cos_fp16 = r.sin_bf16 ? px_calloc(n, sizeof(float), "RoPE fp16 cos table") : NULL;
    r.sin_fp16 = r.cos_fp16 ? px_calloc(n, sizeof(float), "RoPE fp16 sin table") : NULL;
    if (!r.sin_fp16) {
        px_free(inv_freq);
        rope_tables_free(&r);
        return PARITY_ERR_OUT_OF_MEMORY;
    }

    for (uint32_t p = 0; p < n_positions; p++) {
        size_t row = (size_t)p * half;
        rope_cos_sin(inv_freq, half, p, attention_factor, r.cos_f32 + row, r.sin_f32 + row);
        for (uint32_t i = 0; i < half; i++) {
            r.cos_bf16[row + i] = round_bf16(r.cos_f32[row + i]);
            r.sin_bf16[row + i] = round_bf16(r.sin_f32[row + i]);
            r.cos_fp16[row + i] = round_fp16(r.cos_f32[row + i]);
            r.sin_fp16[row + i] = round_fp16(r.sin_f32[row + i]);
        }
    }
    px_free(inv_freq);
    *t = r;
    return PARITY_OK;
}
