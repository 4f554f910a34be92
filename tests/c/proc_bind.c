/* Thread affinity: OMP_PROC_BIND and OMP_PLACES as the environment sets
 * them. Unbound (OMP_PROC_BIND false, or unset without OMP_PLACES):
 * omp_get_proc_bind is omp_proc_bind_false and no thread has a place.
 * Bound: every thread of a
 * region runs on a place of the place list, its affinity mask is exactly
 * that place's processors, and the place queries agree with each other.
 * Prints the policy and the number of places (the same with libgomp), then
 * the verdict. */
#define _GNU_SOURCE
#include <omp.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#define MAXP 1024

/* Whether the calling thread's affinity mask is exactly place p. */
static int mask_is_place(int p)
{
    int n = omp_get_place_num_procs(p);
    if (n < 1 || n > MAXP)
        return 0;
    int ids[MAXP];
    omp_get_place_proc_ids(p, ids);
    cpu_set_t mask;
    if (sched_getaffinity(0, sizeof mask, &mask) != 0)
        return 0;
    if (CPU_COUNT(&mask) != n)
        return 0;
    for (int k = 0; k < n; k++)
        if (!CPU_ISSET(ids[k], &mask))
            return 0;
    int cpu = sched_getcpu();
    return cpu >= 0 && CPU_ISSET(cpu, &mask);
}

int main(void)
{
    /* A place list alone binds, as OMP_PROC_BIND=true. */
    const char *env = getenv("OMP_PROC_BIND");
    int bound = env != NULL ? strcmp(env, "false") != 0 : getenv("OMP_PLACES") != NULL;
    int policy = omp_get_proc_bind();
    int places = omp_get_num_places();
    printf("proc_bind=%d places=%d\n", policy, places);

    CHECK((policy != omp_proc_bind_false) == bound,
          "omp_get_proc_bind follows OMP_PROC_BIND (and OMP_PLACES)");
    CHECK(!bound || places >= 1, "bound threads have places");
    CHECK(omp_get_partition_num_places() == places, "the partition is the place list");
    if (places >= 1 && places <= MAXP) {
        int nums[MAXP];
        omp_get_partition_place_nums(nums);
        for (int k = 0; k < places; k++)
            CHECK(nums[k] == k, "the partition's places are 0..n-1");
    }
    CHECK(omp_get_place_num_procs(places) == 0, "a place beyond the list has no processor");

    for (int round = 0; round < 20; round++) {
#pragma omp parallel
        {
            int p = omp_get_place_num();
            if (bound) {
                CHECK(p >= 0 && p < places, "a bound thread has a place");
                CHECK(p < 0 || mask_is_place(p), "a bound thread runs on its place only");
            } else {
                CHECK(p == -1, "an unbound thread has no place");
            }
        }
    }
    return finish();
}
