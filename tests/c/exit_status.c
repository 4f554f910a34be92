/* main returns 3 on purpose after printing PASS: the status must reach the
 * caller unchanged. */
#include <omp.h>

#include "check.h"

int main(void)
{
    long sum = 0;
#pragma omp parallel for reduction(+ : sum)
    for (int i = 1; i <= 100; i++)
        sum += i;
    CHECK(sum == 5050, "reduction");
    printf("sum=%ld\n", sum);
    if (finish() != 0)
        return 1;
    return 3;
}
