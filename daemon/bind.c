/* bind.c - see bind.h. */
#include "bind.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "status.h"

static gk_dtype dtype_from_wire(Gpucd__V1__DType d)
{
    switch (d) {
    case GPUCD__V1__DTYPE__F32: return GK_F32;
    case GPUCD__V1__DTYPE__BF16: return GK_BF16;
    case GPUCD__V1__DTYPE__F16: return GK_F16;
    case GPUCD__V1__DTYPE__U8: return GK_U8;
    case GPUCD__V1__DTYPE__I32: return GK_I32;
    case GPUCD__V1__DTYPE__I64: return GK_I64;
    default: return GK_DTYPE_INVALID;
    }
}

/* gk_dtype and the wire's DType number the dtypes alike, so a gk_dtype goes out as it is. */
_Static_assert((int)GK_F32 == (int)GPUCD__V1__DTYPE__F32 &&
                   (int)GK_BF16 == (int)GPUCD__V1__DTYPE__BF16 &&
                   (int)GK_F16 == (int)GPUCD__V1__DTYPE__F16 &&
                   (int)GK_U8 == (int)GPUCD__V1__DTYPE__U8 &&
                   (int)GK_I32 == (int)GPUCD__V1__DTYPE__I32 &&
                   (int)GK_I64 == (int)GPUCD__V1__DTYPE__I64,
               "gk_dtype and gpucd.v1.DType differ");

static int same_shape(const gk_tensor *a, const gk_tensor *b)
{
    if (a->dtype != b->dtype || a->ndim != b->ndim)
        return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i])
            return 0;
    return 1;
}

/* A new resident output sent without a shape: the operation says what it is. */
static int shape_left_to_daemon(const gcd_ref *ref, int output)
{
    return output && ref->where_case == GPUCD__V1__TENSOR_REF__WHERE_NEW_RESIDENT &&
           ref->n_shape == 0;
}

/*
 * The tensor's dtype and shape: the request's, or those the operation gives
 * an output whose shape the request left out (implied, shape_left_to_daemon).
 */
static gcd_status tensor_of_ref(const gcd_ref *ref, const char *name, const gk_tensor *implied,
                                gk_tensor *t, char *why, size_t whylen)
{
    memset(t, 0, sizeof *t);
    if (implied != NULL) {
        if (ref->dtype != GPUCD__V1__DTYPE__DTYPE_UNSPECIFIED &&
            dtype_from_wire(ref->dtype) != implied->dtype) {
            snprintf(why, whylen, "%s: dtype %d given, but this output is %s", name,
                     (int)ref->dtype, gk_dtype_name(implied->dtype));
            return GCD_INVALID_ARGUMENT;
        }
        *t = *implied;
        t->data = NULL;
        return GCD_OK;
    }
    t->dtype = dtype_from_wire(ref->dtype);
    if (t->dtype == GK_DTYPE_INVALID) {
        snprintf(why, whylen, "%s: dtype %d is not one of f32, bf16, f16, u8, i32, i64", name,
                 (int)ref->dtype);
        return GCD_INVALID_ARGUMENT;
    }
    if (ref->n_shape > GK_MAX_DIMS) {
        snprintf(why, whylen, "%s: %zu dimensions, at most %d", name, ref->n_shape, GK_MAX_DIMS);
        return GCD_INVALID_ARGUMENT;
    }
    t->ndim = (int)ref->n_shape;
    for (size_t i = 0; i < ref->n_shape; i++) {
        if (ref->shape[i] < 0) {
            snprintf(why, whylen, "%s: dimension %zu is negative (%lld)", name, i,
                     (long long)ref->shape[i]);
            return GCD_INVALID_ARGUMENT;
        }
        t->shape[i] = ref->shape[i];
    }
    return GCD_OK;
}


gcd_status gcd_bind_region_bytes(const gcd_bind_ctx *ctx, const Gpucd__V1__RegionSlice *slice,
                                 uint64_t n, const char *name, gcd_binding *b, char *why,
                                 size_t whylen)
{
    char reason[256];
    gcd_status st = gcd_regions_acquire(ctx->daemon->regions, ctx->pipe, slice->region_id,
                                        &b->region, reason, sizeof reason);
    if (st != GCD_OK) {
        snprintf(why, whylen, "%s: %s", name, reason);
        return st;
    }
    const uint64_t off = slice->offset;
    const size_t size = b->region->size;
    if (off > size || n > size - off) {
        snprintf(why, whylen, "%s: bytes [%llu, +%llu) lie outside region %llu of %zu bytes", name,
                 (unsigned long long)off, (unsigned long long)n,
                 (unsigned long long)slice->region_id, size);
        return GCD_OUT_OF_RANGE;
    }
    b->lo = off;
    b->hi = off + n;
    return GCD_OK;
}

/* Binds one reference; fills b and the view t (data set); implied as tensor_of_ref. */
static gcd_status bind_one(const gcd_bind_ctx *ctx, const gcd_ref *ref, int output,
                           const char *name, const gk_tensor *implied, gcd_binding *b,
                           gk_tensor *t, char *why, size_t whylen)
{
    gcd_daemon *d = ctx->daemon;
    b->ref = ref;
    b->write = output;
    gcd_status st = tensor_of_ref(ref, name, implied, t, why, whylen);
    if (st != GCD_OK)
        return st;
    int64_t bytes = gk_tensor_bytes(t);
    if (bytes < 0) {
        snprintf(why, whylen, "%s: the size of the shape overflows 64 bits", name);
        return GCD_INVALID_ARGUMENT;
    }
    if (bytes == 0) { /* no kernel takes an empty tensor; saying so here is clearest */
        snprintf(why, whylen, "%s: a dimension is 0 (the tensor has no elements)", name);
        return GCD_INVALID_ARGUMENT;
    }
    uint64_t n = (uint64_t)bytes;
    size_t esz = gk_dtype_size(t->dtype);

    switch (ref->where_case) {
    case GPUCD__V1__TENSOR_REF__WHERE_REGION: {
        if (ctx->uid == GCD_UID_REMOTE) {
            snprintf(why, whylen, "%s: shared-memory regions are for local (ipc://) clients; "
                                  "send the tensor inline", name);
            return GCD_PERMISSION_DENIED;
        }
        const uint64_t off = ref->region->offset;
        st = gcd_bind_region_bytes(ctx, ref->region, n, name, b, why, whylen);
        if (st != GCD_OK)
            return st;
        if (off % esz != 0) {
            snprintf(why, whylen, "%s: offset %llu is not a multiple of the %s element size %zu",
                     name, (unsigned long long)off, gk_dtype_name(t->dtype), esz);
            return GCD_INVALID_ARGUMENT;
        }
        t->data = b->region->base + off;
        return GCD_OK;
    }
    case GPUCD__V1__TENSOR_REF__WHERE_PAYLOAD: {
        if (output) {
            b->to_payload = 1; /* placed when the reply payload is laid out */
            return GCD_OK;
        }
        uint64_t off = ref->payload->offset;
        if (off % WIRE_ALIGN != 0) {
            snprintf(why, whylen, "%s: payload offset %llu is not a multiple of %d", name,
                     (unsigned long long)off, WIRE_ALIGN);
            return GCD_INVALID_ARGUMENT;
        }
        if (off > ctx->payload_len || n > ctx->payload_len - off) {
            snprintf(why, whylen, "%s: bytes [%llu, +%llu) lie outside the %zu-byte payload",
                     name, (unsigned long long)off, (unsigned long long)n, ctx->payload_len);
            return GCD_OUT_OF_RANGE;
        }
        t->data = (void *)(ctx->payload + off);
        return GCD_OK;
    }
    case GPUCD__V1__TENSOR_REF__WHERE_RESIDENT: {
        st = gcd_residents_acquire(d->residents, ctx->pipe, ctx->uid, ref->resident, output,
                                   &b->resident, why, whylen);
        if (st != GCD_OK)
            return st;
        if (!same_shape(t, &b->resident->t)) {
            snprintf(why, whylen, "%s: dtype or shape differs from resident tensor %llu's", name,
                     (unsigned long long)ref->resident);
            return GCD_INVALID_ARGUMENT;
        }
        b->lo = 0;
        b->hi = n;
        t->data = b->resident->t.data;
        return GCD_OK;
    }
    case GPUCD__V1__TENSOR_REF__WHERE_NEW_RESIDENT:
        if (!output || !ref->new_resident) {
            snprintf(why, whylen, "%s: new_resident is only for outputs", name);
            return GCD_INVALID_ARGUMENT;
        }
        st = gcd_residents_create(d->residents, ctx->pipe, ctx->uid, t, &b->resident, why,
                                  whylen);
        if (st != GCD_OK)
            return st;
        b->new_resident = 1;
        b->hi = n;
        t->data = b->resident->t.data;
        return GCD_OK;
    default:
        snprintf(why, whylen, "%s: says neither region, payload nor resident", name);
        return GCD_INVALID_ARGUMENT;
    }
}

int gcd_bindings_overlap(const gcd_binding *a, const gcd_binding *b)
{
    int same = (a->region != NULL && a->region == b->region) ||
               (a->resident != NULL && a->resident == b->resident);
    return same && a->lo < b->hi && b->lo < a->hi;
}

static int by_resident_id(const void *x, const void *y)
{
    const gcd_binding *a = *(const gcd_binding *const *)x, *b = *(const gcd_binding *const *)y;
    return a->resident->id < b->resident->id ? -1 : a->resident->id > b->resident->id;
}

/* Locks each resident tensor once, in id order (a write lock if any use writes). */
static void lock_residents(gcd_bound *bound)
{
    gcd_binding *order[GCD_OP_MAX_ARGS];
    int n = 0;
    for (int i = 0; i < bound->n; i++)
        if (bound->b[i].resident != NULL)
            order[n++] = &bound->b[i];
    qsort(order, (size_t)n, sizeof order[0], by_resident_id);
    for (int i = 0; i < n; i++) {
        if (i > 0 && order[i]->resident == order[i - 1]->resident)
            continue; /* inputs only: outputs never share a tensor (checked) */
        if (order[i]->write)
            pthread_rwlock_wrlock(&order[i]->resident->use);
        else
            pthread_rwlock_rdlock(&order[i]->resident->use);
        order[i]->locked = 1;
    }
}

/*
 * The reply payload is zeroed: the padding between outputs, and whatever a
 * kernel leaves unwritten, must never carry stale heap bytes (another client's
 * data).  One of PAYLOAD_MAP_MIN bytes or more is first only a mapping the
 * operation's checks see (its pages untouched: no memory), and moves to the
 * heap once they passed (gcd_bound_payload_commit): a request that declares
 * a huge output its inputs cannot produce is refused having cost no memory.
 */
enum { PAYLOAD_MAP_MIN = 1 << 20 };

static uint8_t *payload_alloc(size_t n, int *mapped)
{
    *mapped = n >= PAYLOAD_MAP_MIN;
    if (!*mapped) {
        uint8_t *p = aligned_alloc(WIRE_ALIGN, n);
        if (p != NULL)
            memset(p, 0, n);
        return p;
    }
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p != MAP_FAILED ? p : NULL;
}

static void payload_free(uint8_t *p, size_t n, int mapped)
{
    if (p == NULL)
        return;
    if (mapped)
        munmap(p, n);
    else
        free(p);
}

void gcd_bound_payload_commit(gcd_op *op, gcd_bound *bound)
{
    if (!bound->out_payload_mapped)
        return;
    const size_t n = bound->out_payload_len;
    uint8_t *heap = aligned_alloc(WIRE_ALIGN, n);
    if (heap == NULL)
        return; /* the mapping serves as well, its pages faulted in as the kernel writes */
    memset(heap, 0, n);
    for (int i = 0; i < op->nargs; i++)
        if (bound->b[i].to_payload)
            op->args[i].t.data = heap + bound->b[i].payload_offset;
    munmap(bound->out_payload, n);
    bound->out_payload = heap;
    bound->out_payload_mapped = 0;
}

gcd_status gcd_bind(const gcd_bind_ctx *ctx, gcd_op *op, const gcd_ref *const refs[],
                    const char *const names[], gcd_bound *bound, char *why, size_t whylen)
{
    memset(bound, 0, sizeof *bound);
    bound->n = op->nargs;
    gcd_status st = GCD_OK;
    for (int i = 0; i < op->nargs && st == GCD_OK; i++) {
        if (refs[i] == NULL)
            continue;
        gk_tensor implied;
        const int implies = shape_left_to_daemon(refs[i], op->args[i].output);
        if (implies) {
            gk_err err = {{0}};
            int rc = gcd_op_output_shape(op, i, &implied, &err);
            if (rc != 0) {
                snprintf(why, whylen, "%s: the daemon cannot size it: %s", names[i], err.msg);
                st = gcd_status_from_gk(rc);
                break;
            }
        }
        st = bind_one(ctx, refs[i], op->args[i].output, names[i], implies ? &implied : NULL,
                      &bound->b[i], &op->args[i].t, why, whylen);
        op->args[i].resident = bound->b[i].resident != NULL;
    }
    for (int i = 0; i < op->nargs && st == GCD_OK; i++) {
        if (!op->args[i].output || refs[i] == NULL)
            continue;
        for (int j = 0; j < op->nargs; j++) {
            if (j != i && refs[j] != NULL && gcd_bindings_overlap(&bound->b[i], &bound->b[j])) {
                snprintf(why, whylen, "output %s overlaps %s %s", names[i],
                         op->args[j].output ? "output" : "input", names[j]);
                st = GCD_INVALID_ARGUMENT;
                break;
            }
        }
    }
    if (st == GCD_OK) {
        size_t total = 0;
        for (int i = 0; i < op->nargs; i++) {
            if (!bound->b[i].to_payload)
                continue;
            bound->b[i].payload_offset = total;
            total += (size_t)wire_align_up((uint64_t)gk_tensor_bytes(&op->args[i].t));
        }
        uint64_t limit = ctx->daemon->cfg.max_message_mb << 20;
        if (total > limit) {
            snprintf(why, whylen, "inline outputs of %zu bytes exceed the %llu-byte message "
                                  "limit; use a region or a resident tensor",
                     total, (unsigned long long)limit);
            st = GCD_MESSAGE_TOO_LARGE;
        } else if (total > 0) {
            if ((bound->out_payload = payload_alloc(total, &bound->out_payload_mapped)) == NULL) {
                snprintf(why, whylen, "out of memory for %zu bytes of inline outputs", total);
                st = GCD_RESOURCE_EXHAUSTED;
            } else {
                bound->out_payload_len = total;
                for (int i = 0; i < op->nargs; i++)
                    if (bound->b[i].to_payload)
                        op->args[i].t.data = bound->out_payload + bound->b[i].payload_offset;
            }
        }
    }
    if (st != GCD_OK) {
        gcd_unbind(ctx, bound, 0);
        return st;
    }
    lock_residents(bound);
    return GCD_OK;
}

gcd_status gcd_bound_payload_charge(const gcd_bind_ctx *ctx, gcd_bound *bound, char *why,
                                    size_t whylen)
{
    if (bound->out_payload_len == 0 || bound->out_payload_held != NULL)
        return GCD_OK;
    const gcd_charge c = {.n = {[GCD_QUOTA_INFLIGHT_BYTES] = bound->out_payload_len}};
    return gcd_quota_take(ctx->daemon->quota, ctx->pipe, &c, &bound->out_payload_held, why,
                          whylen);
}

void gcd_unbind(const gcd_bind_ctx *ctx, gcd_bound *bound, int success)
{
    gcd_daemon *d = ctx->daemon;
    for (int i = 0; i < bound->n; i++) {
        gcd_binding *b = &bound->b[i];
        if (b->locked)
            pthread_rwlock_unlock(&b->resident->use);
        if (b->resident != NULL) {
            if (b->new_resident && !success)
                gcd_residents_free(d->residents, ctx->pipe, ctx->uid, b->resident->id, NULL, 0);
            gcd_residents_release(d->residents, b->resident);
        }
        if (b->region != NULL)
            gcd_regions_release(d->regions, b->region);
        memset(b, 0, sizeof *b);
    }
    if (bound->doorbell.region != NULL)
        gcd_regions_release(d->regions, bound->doorbell.region);
    memset(&bound->doorbell, 0, sizeof bound->doorbell);
    const gcd_charge c = {.n = {[GCD_QUOTA_INFLIGHT_BYTES] = bound->out_payload_len}};
    gcd_quota_give(d->quota, bound->out_payload_held, &c);
    bound->out_payload_held = NULL;
    payload_free(bound->out_payload, bound->out_payload_len, bound->out_payload_mapped);
    bound->out_payload = NULL;
    bound->out_payload_len = 0;
    bound->out_payload_mapped = 0;
}

void gcd_bound_describe(const gcd_bound *bound, int i, const gk_tensor *t,
                        Gpucd__V1__TensorRef *out, Gpucd__V1__RegionSlice *region,
                        Gpucd__V1__InlineSlice *inl, int64_t *shape)
{
    const gcd_binding *b = &bound->b[i];
    gpucd__v1__tensor_ref__init(out);
    out->dtype = (Gpucd__V1__DType)t->dtype; /* the tensor's: the daemon may have chosen it */
    for (int k = 0; k < t->ndim; k++)
        shape[k] = t->shape[k];
    out->n_shape = (size_t)t->ndim;
    out->shape = shape;
    if (b->region != NULL) {
        gpucd__v1__region_slice__init(region);
        region->region_id = b->region->id;
        region->offset = b->lo;
        out->where_case = GPUCD__V1__TENSOR_REF__WHERE_REGION;
        out->region = region;
    } else if (b->to_payload) {
        gpucd__v1__inline_slice__init(inl);
        inl->offset = b->payload_offset;
        out->where_case = GPUCD__V1__TENSOR_REF__WHERE_PAYLOAD;
        out->payload = inl;
    } else {
        out->where_case = GPUCD__V1__TENSOR_REF__WHERE_RESIDENT;
        out->resident = b->resident->id;
    }
}
