/* threadprivate variables: a scalar and an array, `copyin` of both (the
 * array is copied from the master's thread-local area by address), each
 * thread's copy intact across many barriers (user-level threads switch and
 * migrate there), persistence into the next region of the same size,
 * `copyprivate`, and libc's `errno` per thread. */
#include <errno.h>
#include <omp.h>
#include <stdlib.h>

#include "check.h"

#define N 64

int counter = 5;
#pragma omp threadprivate(counter)
double vec[N];
#pragma omp threadprivate(vec)
static long hits;
#pragma omp threadprivate(hits)

int main(void)
{
    CHECK(counter == 5, "initial value");
    counter = 100;
    for (int i = 0; i < N; i++)
        vec[i] = i * 0.5;

    int team = 0;
#pragma omp parallel copyin(counter, vec)
    {
        int me = omp_get_thread_num();
#pragma omp single
        team = omp_get_num_threads();
        CHECK(counter == 100, "copyin of a scalar");
        int same = 1;
        for (int i = 0; i < N; i++)
            same &= vec[i] == i * 0.5;
        CHECK(same, "copyin of an array");
        counter = 1000 + me;
        vec[0] = me;
        for (int r = 0; r < 2000; r++) {
            hits += r;
#pragma omp barrier
            CHECK(counter == 1000 + me && vec[0] == me, "own copy across barriers");
        }
        CHECK(hits == 2000L * 1999 / 2, "own accumulator");
    }
    CHECK(counter == 1000, "the master's copy is thread 0's");

#pragma omp parallel
    {
        int me = omp_get_thread_num();
        CHECK(counter == 1000 + me, "values persist into the next region");
        CHECK(vec[0] == me, "arrays persist too");
    }

#pragma omp parallel
    {
#pragma omp single copyprivate(counter)
        counter = 77;
        CHECK(counter == 77, "copyprivate");
    }

    int errno_ok = 1;
#pragma omp parallel reduction(& : errno_ok)
    {
        int me = omp_get_thread_num();
        errno = 3000 + me;
#pragma omp barrier
#pragma omp barrier
        errno_ok = errno == 3000 + me;
    }
    CHECK(errno_ok, "errno per thread");

    printf("threadprivate: team of %d, counter %d\n", team > 0, counter);
    return finish();
}
