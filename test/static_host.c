/* static_host: a host program that links the installed libparity.a statically and defines
 * functions with the names of the library's internal ones (forward, linear, attention, kern,
 * set_error, json_parse, pool_create, st_open). It links only if the static library keeps
 * those names to itself; it then checks that both its own functions and the library's run.
 *
 *   cc static_host.c $(pkg-config --static --cflags --libs parity) -o static_host
 *
 * (test/test_install.sh builds it against the .a alone and runs it). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <parity.h>

/* The host's own functions, each with a body of its own, so a wrong resolution shows. */
int forward(int x);
int linear(int x);
int attention(int x);
int kern(int x);
int set_error(int x);
int json_parse(int x);
int pool_create(int x);
int st_open(int x);

int forward(int x) { return x + 1; }
int linear(int x) { return 2 * x + 3; }
int attention(int x) { return x * x; }
int kern(int x) { return x - 7; }
int set_error(int x) { return x ^ 0x55; }
int json_parse(int x) { return x * 10 + 4; }
int pool_create(int x) { return 100 - x; }
int st_open(int x) { return x % 5; }

static int failures;

static void expect(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "static_host: FAIL: %s (%s)\n", what, parity_last_error());
        failures++;
    }
}

int main(void) {
    /* the host's functions are the ones its calls reach */
    expect(forward(1) == 2, "host forward");
    expect(linear(1) == 5, "host linear");
    expect(attention(3) == 9, "host attention");
    expect(kern(10) == 3, "host kern");
    expect(set_error(0) == 0x55, "host set_error");
    expect(json_parse(1) == 14, "host json_parse");
    expect(pool_create(1) == 99, "host pool_create");
    expect(st_open(7) == 2, "host st_open");

    /* and the library's run inside it */
    expect(parity_version_number() == PARITY_VERSION_NUMBER, "version");
    parity_model *model = NULL;
    expect(parity_model_open("synthetic:tiny", &model) == PARITY_OK, "parity_model_open");
    if (model) {
        parity_scorer_params params;
        parity_scorer_default_params(&params);
        expect(parity_policy_from_name("vllm+aligned", &params.policy) == PARITY_OK, "policy");
        parity_scorer *scorer = NULL;
        expect(parity_scorer_create(model, &params, &scorer) == PARITY_OK, "parity_scorer_create");
        if (scorer) {
            const int32_t tokens[6] = {1, 7, 3, 12, 5, 9};
            const uint32_t lengths[1] = {6};
            parity_score_options options;
            parity_score_default_options(&options);
            float logprobs[5];
            memset(logprobs, 0xff, sizeof logprobs); /* NaN until written */
            expect(parity_score(scorer, &options, tokens, lengths, 1, logprobs, NULL, NULL, NULL) ==
                       PARITY_OK,
                   "parity_score");
            for (int i = 0; i < 5; i++)
                expect(isfinite(logprobs[i]) && logprobs[i] <= 0.0f, "log-prob finite and <= 0");
            parity_scorer_free(scorer);
        }
        parity_model_free(model);
    }
    /* an error path runs the library's own set_error, not the host's */
    parity_model *none = NULL;
    expect(parity_model_open("synthetic:no-such-config", &none) != PARITY_OK && none == NULL,
           "parity_model_open of an unknown config fails");
    expect(parity_last_error()[0] != '\0', "the failure sets the library's error message");
    if (failures) return 1;
    printf("static_host: 1 passed, 0 failed\n");
    return 0;
}
