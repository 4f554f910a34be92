/* main ends with exit(0) after parallel regions instead of returning. The
 * final PASS is printed by an atexit handler into stdio's buffer (stdout
 * is a pipe under the tests), so it shows only if exit runs the handlers
 * and flushes stdout afterwards. */
#include <omp.h>
#include <stdlib.h>

#include "check.h"

static long result;

static void at_exit(void)
{
    if (result == 499500 && check_failures == 0)
        printf("PASS\n");
    else
        printf("FAIL: result in the atexit handler\n");
    /* No fflush: exit flushes after the handlers. */
}

int main(void)
{
    atexit(at_exit);
#pragma omp parallel for reduction(+ : result) schedule(dynamic, 8)
    for (int i = 0; i < 1000; i++)
        result += i;
    long again = 0;
#pragma omp parallel reduction(+ : again)
    {
#pragma omp for
        for (int i = 0; i < 1000; i++)
            again += 2 * i;
    }
    CHECK(result == 499500 && again == 999000, "reductions before exit");
    printf("result=%ld again=%ld\n", result, again);
    exit(check_failures ? 1 : 0);
}
