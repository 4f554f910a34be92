/* Uses cancellation (`cancel for`, GOMP_cancel and the cancellable loop
 * end). Without OMP_CANCELLATION (the default), the cancel construct does
 * nothing and the loop runs to completion, which is what this program
 * checks. With OMP_CANCELLATION=true, a runtime that cannot cancel must
 * refuse loudly (the tests expect a non-zero exit naming GOMP_cancel). */
#include <omp.h>

#include "check.h"

int main(void)
{
    long sum = 0;
    int cancelled_at = -1;
#pragma omp parallel
    {
#pragma omp for reduction(+ : sum) schedule(dynamic, 4)
        for (int i = 0; i < 1000; i++) {
            sum += i;
            if (i == 10) {
                cancelled_at = i;
#pragma omp cancel for
            }
        }
    }
    /* Cancellation is disabled: every iteration ran. */
    CHECK(omp_get_cancellation() == 0, "cancellation disabled");
    CHECK(sum == 499500, "all iterations ran");
    CHECK(cancelled_at == 10, "the cancel point was reached");
    printf("sum=%ld\n", sum);
    return finish();
}
