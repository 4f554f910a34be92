/* An OpenMP program that also starts an OS thread of its own: the thread
 * counts in one word of a block that the team's threads write in turn
 * (each its own word, round after round, with a barrier between rounds),
 * for as long as the team runs. Across processes that block is merged in
 * place at every barrier on process 0 while the program's own thread keeps
 * writing it, so a merge that assumed the program writes from one thread
 * only would lose some of its counts; after pthread_join every count must
 * be there, and every team thread's last word too. */
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "check.h"

#define WORDS 512 /* one 4 KiB block of longs */
#define ROUNDS 300
#define COUNTER (WORDS - 1)

struct counting {
    volatile long *shared;
    /* Process-private memory (not the heap): [0] the team is done, [1] the
     * thread has counted once. */
    volatile int *flags;
    long counted;
};

static void *count(void *arg)
{
    struct counting *c = arg;
    long n = 0;
    do {
        c->shared[COUNTER] += 1;
        n++;
        c->flags[1] = 1;
    } while (!c->flags[0]);
    c->counted = n;
    return NULL;
}

int main(void)
{
    long *shared = aligned_alloc(4096, WORDS * sizeof *shared);
    for (int i = 0; i < WORDS; i++)
        shared[i] = 0;
    volatile int *flags = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(flags != MAP_FAILED, "mmap");
    flags[0] = flags[1] = 0;
    struct counting *c = malloc(sizeof *c);
    c->shared = shared;
    c->flags = flags;
    pthread_t t;
    CHECK(pthread_create(&t, NULL, count, c) == 0, "pthread_create");
    /* The team runs for about a millisecond on one process: without this
     * wait, the thread might not have started before it ends. */
    while (!flags[1])
        sched_yield();
    int team = 0;
#pragma omp parallel
    {
        int me = omp_get_thread_num();
#pragma omp single
        team = omp_get_num_threads();
        for (int r = 1; r <= ROUNDS; r++) {
            ((volatile long *)shared)[me] = r;
#pragma omp barrier
            for (int q = 0; q < omp_get_num_threads(); q++)
                CHECK(((volatile long *)shared)[q] == r, "a team thread's word after a barrier");
#pragma omp barrier
        }
    }
    flags[0] = 1;
    CHECK(pthread_join(t, NULL) == 0, "pthread_join");
    CHECK(c->counted > 0 && shared[COUNTER] == c->counted,
          "the program's own thread's counts");
    for (int q = 0; q < team; q++)
        CHECK(shared[q] == ROUNDS, "a team thread's last word");
    free(c);
    free(shared);
    return finish();
}
