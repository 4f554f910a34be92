/* A doacross loop (`ordered(1)` with `depend(sink)`/`depend(source)`):
 * libgomp runs it; our runtime does not offer the GOMP_loop_doacross_*
 * and GOMP_doacross_* entry points, and must abort naming the one it
 * met. */
#include <omp.h>

#include "check.h"

#define N 1000

static long a[N];

int main(void)
{
    a[0] = 1;
#pragma omp parallel for ordered(1) schedule(static, 1)
    for (int i = 1; i < N; i++) {
#pragma omp ordered depend(sink : i - 1)
        a[i] = a[i - 1] + 2;
#pragma omp ordered depend(source)
    }
    CHECK(a[N - 1] == 1 + 2 * (N - 1), "the doacross chain");
    printf("a[N-1]=%ld\n", a[N - 1]);
    return finish();
}
