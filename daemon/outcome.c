/* outcome.c - see outcome.h. */
#include "outcome.h"

void gcd_outcome_open(gcd_outcome *out)
{
    atomic_store(&out->id, 0);
    atomic_store(&out->answer, GCD_ANSWER_OPEN);
}

int gcd_outcome_cut(gcd_outcome *out)
{
    int expected = GCD_ANSWER_OPEN;
    return atomic_compare_exchange_strong(&out->answer, &expected, GCD_ANSWER_CUT);
}

int gcd_outcome_take(gcd_outcome *out)
{
    int expected = GCD_ANSWER_OPEN;
    if (atomic_compare_exchange_strong(&out->answer, &expected, GCD_ANSWER_WORKER))
        return 1;
    return expected != GCD_ANSWER_CUT;
}
