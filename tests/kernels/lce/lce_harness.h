/*
 * lce_harness.h - shared by the loss tests: random problems, poisoned output
 * buffers, and an independent reference that materialises every logit in
 * double precision.
 */
#ifndef LCE_HARNESS_H
#define LCE_HARNESS_H

#include "gk.h"

#include <stdint.h>

/* The run's seed: GPUCD_TEST_SEED if set, else time and pid; printed once. */
uint64_t harness_seed(void);
uint64_t rng_next(uint64_t *state);
double rng_uniform(uint64_t *state, double lo, double hi); /* [lo, hi) */

/* One request: inputs in their dtype plus their exact values in double. */
typedef struct lce_problem {
    int64_t N, D, V;
    gk_dtype dtype;      /* of E, C, bias */
    gk_dtype tdtype;     /* of targets */
    gk_lce p;
    int has_bias;
    void *E, *C, *bias, *targets; /* raw buffers */
    double *Ed, *Cd, *biasd;      /* the values the kernel sees, in double */
    int64_t *t;                   /* targets as int64 */
} lce_problem;

/*
 * Random E, C (and bias) uniform in [-scale, scale), rounded to dtype;
 * targets uniform in [0, V) except a fraction ignore_frac set to ignore_index.
 * p starts as gk_lce_defaults.
 */
void lce_problem_make(lce_problem *pb, uint64_t *rng, int64_t N, int64_t D, int64_t V,
                      gk_dtype dtype, gk_dtype tdtype, int has_bias, double scale,
                      double ignore_frac);
/* Sets element i of the raw targets and its int64 mirror. */
void lce_problem_set_target(lce_problem *pb, int64_t i, int64_t value);
/* Re-derives the raw inputs from Ed/Cd/biasd, rounding to dtype (after edits). */
void lce_problem_sync(lce_problem *pb);
void lce_problem_free(lce_problem *pb);

/* Output buffers, poisoned with NaN before each run; absent ones have data NULL. */
typedef struct lce_outputs {
    gk_dtype gdtype; /* of the gradients */
    gk_tensor loss, lse, dE, dC, dbias;
} lce_outputs;

enum { WANT_LSE = 1, WANT_DE = 2, WANT_DC = 4, WANT_DBIAS = 8, WANT_ALL = 15 };

void lce_outputs_make(lce_outputs *o, const lce_problem *pb, int want, gk_dtype gdtype);
void lce_outputs_poison(lce_outputs *o);
void lce_outputs_free(lce_outputs *o);
/* Element i of an output tensor as double (f32, bf16 or f16). */
double tensor_get(const gk_tensor *t, int64_t i);

int lce_problem_run(const lce_problem *pb, lce_outputs *o, gk_err *err);

/* The reference's results; gradient arrays only when asked for. */
typedef struct lce_expect {
    double *loss; /* N for reduction none, else 1 */
    double *lse;  /* N */
    double *dE, *dC, *dbias;
    int64_t nloss;
} lce_expect;

/*
 * Materialised logits in double: every option of gk_lce, filtering element-
 * wise.  Gradients are skipped when want_grads is 0.
 */
void lce_reference(const lce_problem *pb, int want_grads, lce_expect *x);
/* grad_scale * the reduced loss (sum of row losses for none): the function the gradients are of. */
double lce_reference_objective(const lce_problem *pb);
void lce_expect_free(lce_expect *x);

/*
 * ||out - ref|| / ||ref|| over n elements of out (any float dtype) against
 * ref; when ||ref|| is 0 it is ||out||.  NaN when out holds a NaN.
 */
double rel_err(const gk_tensor *out, const double *ref, int64_t n);

#endif
