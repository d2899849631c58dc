/*
 * cpu_cores.h - shares the machine's cores among the CPU backend's runs.
 *
 * The CPU kernels' parallel regions take a team of omp_get_max_threads()
 * threads, one per core by default, and libgomp gives every thread that
 * starts a region a team of its own: requests computing at once ran several
 * times as many threads as cores, and each team's barriers waited on threads
 * the others had pushed off the cores.  So each run first takes cores from
 * here, at least one, and sizes its team to them (omp_set_num_threads on the
 * thread that runs it): the teams together never have more threads than there
 * are cores.  A run that finds no other waiting takes every free core (a lone
 * request uses the whole machine); runs that wait together share the free
 * cores evenly, so small requests, whose kernels run on one thread, still
 * compute side by side.
 */
#ifndef GCD_CPU_CORES_H
#define GCD_CPU_CORES_H

#include <pthread.h>

typedef struct gcd_cpu_cores {
    pthread_mutex_t lock;
    pthread_cond_t freed;
    unsigned cores;   /* in all */
    unsigned team;    /* the most one run takes (its largest useful team) */
    unsigned free;    /* held by no run */
    unsigned waiting; /* runs waiting for a core */
    unsigned peak;    /* the most cores held at once */
} gcd_cpu_cores;

/* cores >= 1 to share, at most team for one run (>= 1).  0, or -1 when out of resources. */
int gcd_cpu_cores_init(gcd_cpu_cores *c, unsigned cores, unsigned team);
void gcd_cpu_cores_fini(gcd_cpu_cores *c);

/* Waits for a free core; returns how many it took (the run's team size). */
unsigned gcd_cpu_cores_take(gcd_cpu_cores *c);

/* Gives back the n cores a take returned. */
void gcd_cpu_cores_give(gcd_cpu_cores *c, unsigned n);

/* The most cores runs have held at once since init. */
unsigned gcd_cpu_cores_peak(gcd_cpu_cores *c);

#endif
