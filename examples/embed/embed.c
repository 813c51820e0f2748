/* embed: how an inference server adopts libparity, built the way a server builds against an
 * installed library:
 *
 *   cc embed.c $(pkg-config --cflags --libs parity) -o embed
 *
 * The server keeps its own layer loop and its own bf16 buffers, and calls libparity's region
 * kernels at the three regions where rounding points matter (residual + RMSNorm, RoPE,
 * SwiGLU) under the policy its learner uses. Then it checks itself against the library's
 * scorer on a model, as a sync probe would. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <parity.h>

enum { TOKENS = 5, DIM = 64, HEADS = 4, HEAD_DIM = 16, FFN = 160, LAYERS = 2 };

static int check(int status, const char *what) {
    if (status != PARITY_OK) {
        fprintf(stderr, "embed: %s: %s: %s\n", what, parity_status_name(status), parity_last_error());
        exit(1);
    }
    return status;
}

static uint16_t random_bf16(unsigned *seed, float scale, float offset) {
    *seed = *seed * 1103515245u + 12345u;
    return parity_bf16_from_f32(offset + scale * ((float)(*seed >> 8) / 16777216.0f - 0.5f));
}

int main(void) {
    if (parity_version_number() != PARITY_VERSION_NUMBER) {
        fprintf(stderr, "embed: compiled against libparity %s, running with %s\n",
                PARITY_VERSION_STRING, parity_version());
        return 1;
    }
    parity_policy policy;
    check(parity_policy_from_name("vllm+aligned", &policy), "policy");

    /* the server's own activations and weights, bf16 */
    static uint16_t residual[TOKENS][DIM], delta[TOKENS][DIM], normed[TOKENS][DIM];
    static uint16_t q[TOKENS][HEADS * HEAD_DIM], gate[TOKENS][FFN], up[TOKENS][FFN];
    static uint16_t norm_w[DIM];
    int32_t positions[TOKENS];
    unsigned seed = 1;
    for (int t = 0; t < TOKENS; t++) {
        positions[t] = t;
        for (int i = 0; i < DIM; i++) residual[t][i] = random_bf16(&seed, 2.0f, 0.0f);
    }
    for (int i = 0; i < DIM; i++) norm_w[i] = random_bf16(&seed, 0.1f, 1.0f);

    for (int layer = 0; layer < LAYERS; layer++) {
        /* stand-ins for the server's attention and MLP GEMMs */
        for (int t = 0; t < TOKENS; t++) {
            for (int i = 0; i < DIM; i++) delta[t][i] = random_bf16(&seed, 1.0f, 0.0f);
            for (int i = 0; i < HEADS * HEAD_DIM; i++) q[t][i] = random_bf16(&seed, 2.0f, 0.0f);
            for (int i = 0; i < FFN; i++) {
                gate[t][i] = random_bf16(&seed, 4.0f, 0.0f);
                up[t][i] = random_bf16(&seed, 2.0f, 0.0f);
            }
        }
        /* the three regions, at the policy's rounding points, in place on the server's buffers */
        check(parity_rmsnorm_residual(&policy, TOKENS, DIM, &delta[0][0], DIM, &residual[0][0], DIM,
                                      norm_w, 1e-6f, &residual[0][0], DIM, &normed[0][0], DIM),
              "residual + RMSNorm");
        check(parity_rope(&policy, TOKENS, HEADS, HEAD_DIM, &q[0][0], HEADS * HEAD_DIM, positions,
                          1e6), "RoPE");
        check(parity_swiglu(&policy, TOKENS, FFN, &gate[0][0], FFN, &up[0][0], FFN, &gate[0][0], FFN),
              "SwiGLU");
    }
    double checksum = 0;
    for (int t = 0; t < TOKENS; t++)
        for (int i = 0; i < DIM; i++) checksum += parity_bf16_to_f32(normed[t][i]);
    printf("embed: libparity %s, %d layers of region kernels under vllm+aligned, checksum %.6f\n",
           parity_version(), LAYERS, checksum);

    /* a self-check against the library's learner entry point */
    parity_model *model;
    check(parity_model_open("synthetic:tiny:7", &model), "model");
    parity_scorer_params sp;
    parity_scorer_default_params(&sp);
    sp.policy = policy;
    parity_scorer *scorer;
    check(parity_scorer_create(model, &sp, &scorer), "scorer");
    const int32_t tokens[8] = {3, 1, 4, 1, 5, 9, 2, 6};
    uint32_t len = 8;
    float lp[7], again[7];
    parity_score_options o;
    parity_score_default_options(&o);
    check(parity_score(scorer, &o, tokens, &len, 1, lp, NULL, NULL, NULL), "score");
    check(parity_scorer_probe(scorer, tokens, len, lp), "probe");
    check(parity_score(scorer, &o, tokens, &len, 1, again, NULL, NULL, NULL), "score again");
    int same = !memcmp(lp, again, sizeof lp);
    printf("embed: scorer log p(x_1..x_7) = %.6f ... %.6f, repeatable bit for bit: %s\n",
           (double)lp[0], (double)lp[6], same ? "yes" : "NO");
    parity_scorer_free(scorer);
    parity_model_free(model);
    return same && isfinite(checksum) ? 0 : 1;
}
