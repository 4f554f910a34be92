/* A genuine data race: every thread writes the global `racy` in each of 20
 * rounds with no synchronisation between the writes (a barrier after
 * each round). libgomp runs it (some thread's value wins); across
 * processes our runtime finds the race when it merges the writes, and
 * stops with a report naming `racy` (the default) or, with
 * MENPS_DSM_ON_RACE=report, reports it once and goes on. */
#include <omp.h>

#include "check.h"

int racy;
int rounds_done;

int main(void)
{
#pragma omp parallel
    {
        int me = omp_get_thread_num();
        for (int r = 0; r < 20; r++) {
            racy = r * 100 + me + 1;
#pragma omp barrier
        }
#pragma omp master
        rounds_done = 20;
    }
    CHECK(rounds_done == 20, "rounds");
    CHECK(racy > 1900, "the last round's value");
    printf("rounds=%d\n", rounds_done);
    return finish();
}
