/* The entry points of code built by GCC before 4.9, called by hand as that
 * code calls them: GOMP_parallel_start / GOMP_parallel_end (the caller is
 * the team's thread 0 and runs the outlined function itself), and the
 * combined GOMP_parallel_loop_dynamic_start and
 * GOMP_parallel_sections_start, whose outlined functions take their first
 * chunk with *_next. */
#include <stdbool.h>
#include <omp.h>

#include "check.h"

void GOMP_parallel_start(void (*fn)(void *), void *data, unsigned num_threads);
void GOMP_parallel_end(void);
void GOMP_parallel_loop_dynamic_start(void (*fn)(void *), void *data, unsigned num_threads,
                                      long start, long end, long incr, long chunk);
bool GOMP_loop_dynamic_next(long *istart, long *iend);
void GOMP_loop_end_nowait(void);
void GOMP_parallel_sections_start(void (*fn)(void *), void *data, unsigned num_threads,
                                  unsigned count);
unsigned GOMP_sections_next(void);
void GOMP_sections_end_nowait(void);

#define N 1000
#define MAXT 64

struct shared {
    int size[MAXT];
    int hits[N];
    int sections[4];
    long after_barrier[MAXT];
};

static struct shared s;

static void region(void *data)
{
    struct shared *sh = data;
    int t = omp_get_thread_num();
    if (t < MAXT)
        sh->size[t] = omp_get_num_threads();
#pragma omp barrier
    long sum = 0;
    for (int k = 0; k < omp_get_num_threads() && k < MAXT; k++)
        sum += sh->size[k];
    if (t < MAXT)
        sh->after_barrier[t] = sum;
}

static void loop(void *data)
{
    struct shared *sh = data;
    long a, b;
    while (GOMP_loop_dynamic_next(&a, &b))
        for (long i = a; i < b; i++)
            sh->hits[i] += 1;
    GOMP_loop_end_nowait();
}

static void sections(void *data)
{
    struct shared *sh = data;
    for (unsigned k = GOMP_sections_next(); k != 0; k = GOMP_sections_next())
        sh->sections[k - 1] += (int)k;
    GOMP_sections_end_nowait();
}

int main(void)
{
    int n = omp_get_max_threads();
    GOMP_parallel_start(region, &s, 0);
    region(&s);
    GOMP_parallel_end();
    for (int t = 0; t < n && t < MAXT; t++) {
        CHECK(s.size[t] == n, "every thread of the team ran");
        CHECK(s.after_barrier[t] == (long)n * n, "the barrier inside");
    }

    GOMP_parallel_loop_dynamic_start(loop, &s, 0, 0, N, 1, 7);
    loop(&s);
    GOMP_parallel_end();
    for (int i = 0; i < N; i++)
        CHECK(s.hits[i] == 1, "every iteration once");

    GOMP_parallel_sections_start(sections, &s, 0, 3);
    sections(&s);
    GOMP_parallel_end();
    CHECK(s.sections[0] == 1 && s.sections[1] == 2 && s.sections[2] == 3 && s.sections[3] == 0,
          "every section once");

    /* A team of one (num_threads 1) through the same entry points. */
    GOMP_parallel_start(region, &s, 1);
    region(&s);
    GOMP_parallel_end();
    CHECK(s.size[0] == 1, "a team of one");
    printf("old abi: ok\n");
    return finish();
}
