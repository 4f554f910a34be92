/* Shared by the test programs: records failed checks (from any thread) and
 * prints the verdict from main.
 *
 * CHECK(cond, what) may be used inside and outside parallel regions; only
 * the first failure's description is kept. finish() prints "PASS" or
 * "FAIL: <what>" and returns the exit status for main. Nothing here prints
 * from team threads. */
#ifndef CHECK_H
#define CHECK_H

#include <stdio.h>

static int check_failures;
static const char *check_first_failure;

static void check_failed(const char *what)
{
    int first;
#pragma omp atomic capture
    first = check_failures++;
    if (first == 0)
        check_first_failure = what;
}

#define CHECK(cond, what)                                                    \
    do {                                                                     \
        if (!(cond))                                                         \
            check_failed(what);                                              \
    } while (0)

static inline int finish(void)
{
    if (check_failures != 0) {
        printf("FAIL: %s (%d failed checks)\n",
               check_first_failure ? check_first_failure : "?",
               check_failures);
        fflush(stdout);
        return 1;
    }
    printf("PASS\n");
    fflush(stdout);
    return 0;
}

#endif
