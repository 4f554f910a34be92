/* omp_lock_t and omp_nest_lock_t: mutual exclusion with set/unset and with
 * test, test by a non-owner while held, re-locking a nest lock by its
 * owner (omp_test_nest_lock returns the new nesting count), an array of
 * locks on the heap, a lock in a global. (GCC 12's libgomp declares but
 * does not export omp_init_lock_with_hint, so it is not used.) */
#include <omp.h>
#include <stdlib.h>

#include "check.h"

#define N 2000
#define BUCKETS 16

static omp_lock_t global_lock;
static long bucket_sum[BUCKETS];

int main(void)
{
    omp_lock_t lock;
    long counter = 0;
    int inside = 0, overlap = 0;

    /* set/unset */
    omp_init_lock(&lock);
#pragma omp parallel for schedule(dynamic, 5)
    for (int i = 0; i < N; i++) {
        omp_set_lock(&lock);
        if (inside)
            overlap = 1;
        inside = 1;
        long c = counter;
        counter = c + i;
        inside = 0;
        omp_unset_lock(&lock);
    }
    CHECK(!overlap, "omp_set_lock: two threads inside");
    CHECK(counter == (long)N * (N - 1) / 2, "omp_set_lock sum");
    printf("set_lock: %ld\n", counter);

    /* test: spin on omp_test_lock */
    counter = 0;
    long failed_tests = 0;
#pragma omp parallel for schedule(static, 3) reduction(+ : failed_tests)
    for (int i = 0; i < N; i++) {
        while (!omp_test_lock(&lock))
            failed_tests++;
        if (inside)
            overlap = 1;
        inside = 1;
        counter += 2 * i;
        inside = 0;
        omp_unset_lock(&lock);
    }
    CHECK(!overlap, "omp_test_lock: two threads inside");
    CHECK(counter == (long)N * (N - 1), "omp_test_lock sum");
    CHECK(failed_tests >= 0, "failed tests count");
    printf("test_lock: %ld\n", counter);

    /* A lock held by thread 0 cannot be taken by the others. */
    int others_got_it = 0, after_release = 0;
#pragma omp parallel reduction(+ : others_got_it, after_release)
    {
        if (omp_get_thread_num() == 0)
            omp_set_lock(&lock);
#pragma omp barrier
        if (omp_get_thread_num() != 0 && omp_test_lock(&lock)) {
            others_got_it++;
            omp_unset_lock(&lock);
        }
#pragma omp barrier
        if (omp_get_thread_num() == 0)
            omp_unset_lock(&lock);
#pragma omp barrier
        /* Free now: exactly one of the team gets it in the next phase... */
#pragma omp single
        {
            if (omp_test_lock(&lock)) {
                after_release++;
                omp_unset_lock(&lock);
            }
        }
    }
    CHECK(others_got_it == 0, "omp_test_lock succeeded on a held lock");
    CHECK(after_release == 1, "omp_test_lock failed on a free lock");
    omp_destroy_lock(&lock);
    printf("held lock: ok\n");

    /* Nest locks. */
    omp_nest_lock_t nest;
    omp_init_nest_lock(&nest);
    int counts_ok = 1, foreign = 0;
    long nested_total = 0;
#pragma omp parallel reduction(& : counts_ok) reduction(+ : foreign)
    {
        /* The owner locks it several times; the count goes up by one. */
#pragma omp for schedule(dynamic)
        for (int i = 0; i < 200; i++) {
            omp_set_nest_lock(&nest);
            omp_set_nest_lock(&nest);
            int c = omp_test_nest_lock(&nest);
            counts_ok &= c == 3;
            c = omp_test_nest_lock(&nest);
            counts_ok &= c == 4;
            nested_total += i;
            omp_unset_nest_lock(&nest);
            omp_unset_nest_lock(&nest);
            omp_unset_nest_lock(&nest);
            omp_unset_nest_lock(&nest);
        }
        /* Held by thread 0 (twice): the others' tests fail. */
        if (omp_get_thread_num() == 0) {
            counts_ok &= omp_test_nest_lock(&nest) == 1;
            omp_set_nest_lock(&nest);
        }
#pragma omp barrier
        if (omp_get_thread_num() != 0) {
            int c = omp_test_nest_lock(&nest);
            if (c != 0) {
                foreign++;
                omp_unset_nest_lock(&nest);
            }
        }
#pragma omp barrier
        if (omp_get_thread_num() == 0) {
            omp_unset_nest_lock(&nest);
            omp_unset_nest_lock(&nest);
        }
#pragma omp barrier
#pragma omp single
        {
            counts_ok &= omp_test_nest_lock(&nest) == 1;
            omp_unset_nest_lock(&nest);
        }
    }
    CHECK(counts_ok, "omp_test_nest_lock nesting counts");
    CHECK(foreign == 0, "omp_test_nest_lock succeeded on another thread's lock");
    CHECK(nested_total == 199 * 200 / 2, "nest lock sum");
    omp_destroy_nest_lock(&nest);
    printf("nest_lock: %ld\n", nested_total);

    /* Recursive use of a nest lock by its owner. */
    omp_init_nest_lock(&nest);
    long depth_total = 0;
#pragma omp parallel for schedule(static, 1)
    for (int i = 0; i < 64; i++) {
        for (int d = 0; d < 5; d++)
            omp_set_nest_lock(&nest);
        depth_total += 5;
        for (int d = 0; d < 5; d++)
            omp_unset_nest_lock(&nest);
    }
    omp_destroy_nest_lock(&nest);
    CHECK(depth_total == 320, "recursive nest lock");

    /* An array of locks (a global one and heap ones), with hints. */
    omp_lock_t *bucket_locks = malloc(BUCKETS * sizeof *bucket_locks);
    CHECK(bucket_locks != NULL, "malloc of locks");
    for (int b = 0; b < BUCKETS; b++) {
        omp_init_lock(&bucket_locks[b]);
        bucket_sum[b] = 0;
    }
    omp_init_lock(&global_lock);
    long global_count = 0;
#pragma omp parallel for schedule(guided)
    for (int i = 0; i < N; i++) {
        int b = (i * 7) % BUCKETS;
        omp_set_lock(&bucket_locks[b]);
        bucket_sum[b] += i;
        omp_unset_lock(&bucket_locks[b]);
        omp_set_lock(&global_lock);
        global_count++;
        omp_unset_lock(&global_lock);
    }
    long total = 0;
    for (int b = 0; b < BUCKETS; b++) {
        total += bucket_sum[b];
        omp_destroy_lock(&bucket_locks[b]);
    }
    omp_destroy_lock(&global_lock);
    free(bucket_locks);
    CHECK(total == (long)N * (N - 1) / 2 && global_count == N, "array of locks");
    printf("bucket locks: total=%ld b0=%ld b15=%ld count=%ld\n", total, bucket_sum[0],
           bucket_sum[15], global_count);
    return finish();
}
