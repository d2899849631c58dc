/*
 * area.c - the connection's area: the client's completion records and its
 * submission queue (proto/submit_queue.h), one region of the daemon's.
 * Made and registered before the first call that can end on a record, through
 * the library's own region and control calls (never the compute path, which
 * only reads it); made anew after a reconnect, since the daemon may be a new
 * one that knows no region of ours.  Earlier connections' areas stay mapped
 * until close: a caller may still be reading one of their records.  An area
 * the daemon refuses (a quota, an old daemon) leaves the calls on their
 * replies until the next connection; a queue it does not open leaves them on
 * the socket.
 */
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

/* Maps the daemon's wake page, a sealed memfd from its descriptor socket; NULL when it cannot. */
static submit_wake *wake_map(gpucd_client *c)
{
    fdpass_request req = {.magic = FDPASS_MAGIC, .version = FDPASS_VERSION,
                          .op = FDPASS_OP_WAKE};
    fdpass_answer ans;
    int fd;
    if (gpucdc_fdpass(c, "submit_queue_open", &req, -1, &ans, &fd) != 0 || fd < 0)
        return NULL;
    /* Sealed, the page can never shrink under this mapping: the daemon's word is safe to use. */
    const int seals = fcntl(fd, F_GET_SEALS);
    struct stat st;
    void *p = MAP_FAILED;
    if (seals >= 0 && (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) == (F_SEAL_SHRINK | F_SEAL_GROW) &&
        fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size >= SUBMIT_WAKE_BYTES)
        p = mmap(NULL, SUBMIT_WAKE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    return p == MAP_FAILED ? NULL : p;
}

/*
 * Opens the submission queue in the area r (just registered): on success
 * r->wake is set and calls whose record is in r may be queued.  A failure
 * (an older daemon, --submit-queues 0) leaves them on the socket.
 */
static void queue_open(gpucd_client *c, gpucd_region *r)
{
    submit_area *a = r->data;
    for (uint64_t i = 0; i < SUBMIT_SLOTS; i++)
        atomic_init(&a->cells[i].seq, i); /* every cell free for its first producer */
    gpucdc_request req;
    gpucdc_request_init(&req, c, "submit_queue_open");
    Gpucd__V1__SubmitQueueOpen open = GPUCD__V1__SUBMIT_QUEUE_OPEN__INIT;
    open.region_id = r->id;
    req.msg.op_case = GPUCD__V1__REQUEST__OP_SUBMIT_QUEUE_OPEN;
    req.msg.submit_queue_open = &open;
    gpucdc_reply rep;
    if (gpucdc_control_call(&req, NULL, &rep) != 0)
        return;
    const bool opened = rep.reply->result_case == GPUCD__V1__REPLY__RESULT_SUBMIT_QUEUE;
    gpucdc_reply_free(&rep);
    if (opened)
        atomic_store_explicit(&r->wake, wake_map(c), memory_order_release);
}

bool gpucdc_area_ready(gpucd_client *c)
{
    unsigned conn = atomic_load_explicit(&c->connections, memory_order_acquire);
    /* connection first: its store comes after the state's */
    if (atomic_load_explicit(&c->area.connection, memory_order_acquire) == conn) {
        const int state = atomic_load_explicit(&c->area.state, memory_order_acquire);
        if (state != GPUCDC_AREA_UNTRIED)
            return state == GPUCDC_AREA_READY;
    }
    pthread_mutex_lock(&c->area.lock);
    /* Again under the lock: a reconnect may have come while this thread waited for it, and an
     * area stored under an older number would be taken for the current connection's. */
    conn = atomic_load_explicit(&c->connections, memory_order_acquire);
    if (atomic_load_explicit(&c->area.state, memory_order_relaxed) == GPUCDC_AREA_UNTRIED ||
        atomic_load_explicit(&c->area.connection, memory_order_relaxed) != conn) {
        gpucd_region *r;
        /* Its own error message must not outlive this: the call that asked goes on. */
        int rv = gpucdc_region_make(c, sizeof(submit_area), &r);
        if (rv == 0)
            queue_open(c, r); /* without a queue, calls use the socket */
        gpucdc_clear_error();
        if (rv == 0) {
            gpucd_region *old = atomic_load_explicit(&c->area.region, memory_order_relaxed);
            if (old != NULL) {
                old->next_retired = c->area.retired;
                c->area.retired = old;
            }
            atomic_store_explicit(&c->area.region, r, memory_order_release);
            c->area.next = 0; /* every record of the new area is free */
        }
        atomic_store_explicit(&c->area.state, rv == 0 ? GPUCDC_AREA_READY : GPUCDC_AREA_UNAVAILABLE,
                              memory_order_release);
        atomic_store_explicit(&c->area.connection, conn, memory_order_release);
    }
    const int state = atomic_load_explicit(&c->area.state, memory_order_relaxed);
    pthread_mutex_unlock(&c->area.lock);
    return state == GPUCDC_AREA_READY;
}

void gpucdc_area_close(gpucd_client *c)
{
    gpucd_region *r = atomic_load_explicit(&c->area.region, memory_order_relaxed);
    if (r != NULL)
        gpucdc_region_forget(r);
    for (r = c->area.retired; r != NULL;) {
        gpucd_region *next = r->next_retired;
        gpucdc_region_forget(r);
        r = next;
    }
    pthread_mutex_destroy(&c->area.lock);
}
