/*
 * make_seeds.c - writes a seed corpus of valid requests (one file each) so
 * the fuzzer starts from the protocol's shapes instead of random bytes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire.h"

static int seed_write(const char *dir, const char *name, Gpucd__V1__Request *req,
                      const void *payload, size_t plen)
{
    req->version = GPUCD__V1__VERSION__VERSION_CURRENT;
    req->id = 7;
    size_t hl = gpucd__v1__request__get_packed_size(req);
    size_t off = wire_payload_offset(hl);
    unsigned char *buf = calloc(1, off + plen);
    if (buf == NULL)
        return -1;
    wire_pack_header(buf, &req->base, hl);
    if (plen > 0)
        memcpy(buf + off, payload, plen);
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    int rc = f != NULL && fwrite(buf, 1, off + plen, f) == off + plen ? 0 : -1;
    if (f != NULL)
        fclose(f);
    free(buf);
    return rc;
}

static Gpucd__V1__TensorRef *inline_ref(Gpucd__V1__TensorRef *t, Gpucd__V1__InlineSlice *s,
                                        Gpucd__V1__DType dt, int64_t *shape, size_t ndim,
                                        uint64_t offset)
{
    gpucd__v1__tensor_ref__init(t);
    gpucd__v1__inline_slice__init(s);
    t->dtype = dt;
    t->shape = shape;
    t->n_shape = ndim;
    s->offset = offset;
    t->where_case = GPUCD__V1__TENSOR_REF__WHERE_PAYLOAD;
    t->payload = s;
    return t;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    int rc = 0;
    float payload[256];
    for (int i = 0; i < 256; i++)
        payload[i] = (float)(i % 17) * 0.25f - 1.0f;

    Gpucd__V1__Request ping = GPUCD__V1__REQUEST__INIT;
    Gpucd__V1__Ping p = GPUCD__V1__PING__INIT;
    ping.op_case = GPUCD__V1__REQUEST__OP_PING;
    ping.ping = &p;
    rc |= seed_write(dir, "ping", &ping, NULL, 0);

    Gpucd__V1__Request sq = GPUCD__V1__REQUEST__INIT;
    Gpucd__V1__SubmitQueueOpen sqo = GPUCD__V1__SUBMIT_QUEUE_OPEN__INIT;
    sqo.region_id = 1;
    sq.op_case = GPUCD__V1__REQUEST__OP_SUBMIT_QUEUE_OPEN;
    sq.submit_queue_open = &sqo;
    rc |= seed_write(dir, "submit_queue_open", &sq, NULL, 0);

    /* conv2d_forward: x (1,2,4,4) at 0, w (3,2,3,3) at 128, y back in the payload. */
    Gpucd__V1__Request conv = GPUCD__V1__REQUEST__INIT;
    Gpucd__V1__Conv2dForward cf = GPUCD__V1__CONV2D_FORWARD__INIT;
    Gpucd__V1__Conv2dParams cp = GPUCD__V1__CONV2D_PARAMS__INIT;
    Gpucd__V1__TensorRef x, w, y;
    Gpucd__V1__InlineSlice xs, ws, ys;
    int64_t xsh[] = {1, 2, 4, 4}, wsh[] = {3, 2, 3, 3}, ysh[] = {1, 3, 2, 2};
    cp.stride_h = cp.stride_w = 1;
    cf.params = &cp;
    cf.x = inline_ref(&x, &xs, GPUCD__V1__DTYPE__F32, xsh, 4, 0);
    cf.w = inline_ref(&w, &ws, GPUCD__V1__DTYPE__F32, wsh, 4, 128);
    cf.y = inline_ref(&y, &ys, GPUCD__V1__DTYPE__F32, ysh, 4, 0);
    conv.op_case = GPUCD__V1__REQUEST__OP_CONV2D_FORWARD;
    conv.conv2d_forward = &cf;
    rc |= seed_write(dir, "conv2d_forward", &conv, payload, sizeof payload);
    /* The same with a completion record (no region exists in the fuzzer: its refusals). */
    Gpucd__V1__RegionSlice bell = GPUCD__V1__REGION_SLICE__INIT;
    bell.region_id = 1;
    bell.offset = 64;
    conv.doorbell = &bell;
    rc |= seed_write(dir, "conv2d_forward_doorbell", &conv, payload, sizeof payload);
    conv.record_only = 1;
    rc |= seed_write(dir, "conv2d_forward_record_only", &conv, payload, sizeof payload);
    conv.record_only = 0;
    conv.doorbell = NULL;

    /* embedding_forward: 4 u8 indices, table (8, 4), out inline. */
    Gpucd__V1__Request emb = GPUCD__V1__REQUEST__INIT;
    Gpucd__V1__EmbeddingForward ef = GPUCD__V1__EMBEDDING_FORWARD__INIT;
    Gpucd__V1__TensorRef idx, tab, out;
    Gpucd__V1__InlineSlice is, ts, os;
    int64_t ish[] = {4}, tsh[] = {8, 4}, osh[] = {4, 4};
    unsigned char epay[192] = {1, 3, 5, 7};
    memcpy(epay + 64, payload, 128);
    ef.indices = inline_ref(&idx, &is, GPUCD__V1__DTYPE__U8, ish, 1, 0);
    ef.table = inline_ref(&tab, &ts, GPUCD__V1__DTYPE__F32, tsh, 2, 64);
    ef.out = inline_ref(&out, &os, GPUCD__V1__DTYPE__F32, osh, 2, 0);
    emb.op_case = GPUCD__V1__REQUEST__OP_EMBEDDING_FORWARD;
    emb.embedding_forward = &ef;
    rc |= seed_write(dir, "embedding_forward", &emb, epay, sizeof epay);

    /* embedding_bag: i32 ids (2, 3) with padding, table (8, 4), out inline. */
    Gpucd__V1__Request bag = GPUCD__V1__REQUEST__INIT;
    Gpucd__V1__EmbeddingBag eb = GPUCD__V1__EMBEDDING_BAG__INIT;
    Gpucd__V1__TensorRef bidx, btab, bout;
    Gpucd__V1__InlineSlice bis, bts, bos;
    int64_t bish[] = {2, 3}, bosh[] = {2, 4};
    unsigned char bpay[192] = {0};
    const int32_t bids[6] = {1, -1, 3, 7, 0, -1};
    memcpy(bpay, bids, sizeof bids);
    memcpy(bpay + 64, payload, 128);
    eb.indices = inline_ref(&bidx, &bis, GPUCD__V1__DTYPE__I32, bish, 2, 0);
    eb.table = inline_ref(&btab, &bts, GPUCD__V1__DTYPE__F32, tsh, 2, 64);
    eb.out = inline_ref(&bout, &bos, GPUCD__V1__DTYPE__F32, bosh, 2, 0);
    bag.op_case = GPUCD__V1__REQUEST__OP_EMBEDDING_BAG;
    bag.embedding_bag = &eb;
    rc |= seed_write(dir, "embedding_bag", &bag, bpay, sizeof bpay);

    /* linear_cross_entropy: E (2,4), C (5,4), targets i32 (2), loss scalar. */
    Gpucd__V1__Request lce = GPUCD__V1__REQUEST__INIT;
    Gpucd__V1__LinearCrossEntropy lf = GPUCD__V1__LINEAR_CROSS_ENTROPY__INIT;
    Gpucd__V1__TensorRef e, c, tg, loss;
    Gpucd__V1__InlineSlice es, cs, tgs, ls;
    int64_t esh[] = {2, 4}, csh[] = {5, 4}, tgsh[] = {2};
    unsigned char lpay[256] = {0};
    memcpy(lpay, payload, 32);
    memcpy(lpay + 64, payload + 8, 80);
    lpay[192] = 1;
    lpay[196] = 4;
    lf.e = inline_ref(&e, &es, GPUCD__V1__DTYPE__F32, esh, 2, 0);
    lf.c = inline_ref(&c, &cs, GPUCD__V1__DTYPE__F32, csh, 2, 64);
    lf.targets = inline_ref(&tg, &tgs, GPUCD__V1__DTYPE__I32, tgsh, 1, 192);
    lf.loss = inline_ref(&loss, &ls, GPUCD__V1__DTYPE__F32, NULL, 0, 0);
    lce.op_case = GPUCD__V1__REQUEST__OP_LINEAR_CROSS_ENTROPY;
    lce.linear_cross_entropy = &lf;
    rc |= seed_write(dir, "linear_cross_entropy", &lce, lpay, sizeof lpay);

    /* multihot_encode with a tiny custom layout. */
    Gpucd__V1__Request mh = GPUCD__V1__REQUEST__INIT;
    Gpucd__V1__MultihotEncode mf = GPUCD__V1__MULTIHOT_ENCODE__INIT;
    Gpucd__V1__MultihotLayout ml = GPUCD__V1__MULTIHOT_LAYOUT__INIT;
    uint32_t slots[] = {3, 2}, offs[] = {0, 3};
    ml.height = 1;
    ml.width = 2;
    ml.channels = 5;
    ml.n_slots = ml.n_offsets = 2;
    ml.slots = slots;
    ml.offsets = offs;
    Gpucd__V1__TensorRef ob, mo;
    Gpucd__V1__InlineSlice obs, mos;
    int64_t obsh[] = {1, 4}, mosh[] = {1, 5, 1, 2};
    unsigned char mpay[64] = {2, 1, 0, 1};
    mf.layout = &ml;
    mf.obs = inline_ref(&ob, &obs, GPUCD__V1__DTYPE__U8, obsh, 2, 0);
    mf.out = inline_ref(&mo, &mos, GPUCD__V1__DTYPE__F32, mosh, 4, 0);
    mh.op_case = GPUCD__V1__REQUEST__OP_MULTIHOT_ENCODE;
    mh.multihot_encode = &mf;
    rc |= seed_write(dir, "multihot_encode", &mh, mpay, sizeof mpay);

    if (rc != 0)
        fprintf(stderr, "make_seeds: could not write every seed into %s\n", dir);
    return rc != 0;
}
