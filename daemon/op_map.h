/*
 * op_map.h - every operation the daemon runs, once (in the style of libuv's
 * UV_HANDLE_TYPE_MAP): GCD_OP_MAP(XX) calls XX(KIND, name, WIRE, SHARE) for
 * each, and the lists that follow the operations are expansions of it: the
 * gcd_op_kind enum and the operations' names (ops.h), the compute request
 * kinds that the counters keep (stats.h) and the wire case of each
 * operation (ops/table.h).  The rest of an operation is its family's entry
 * in daemon/ops/.
 *
 *   KIND   its gcd_op_kind is GCD_OP_<KIND>
 *   name   how messages, logs and the table check name it
 *   WIRE   the case of gpucd.proto's Request oneof that carries it,
 *          GPUCD__V1__REQUEST__OP_<WIRE>
 *   SHARE  FIRST, or NEXT for an operation that the wire case of the row above
 *          carries too (nmmo3_encode carries the encoder's forward and, given
 *          dout, its backward).  Requests are counted per wire case, as
 *          GCD_REQ_<WIRE>, under the name of the case's FIRST operation.
 *
 * A new message with no row here fails to build (request.c's switch over the
 * wire cases has no default); two FIRST rows of one case fail too (the
 * request kind is defined twice).
 */
#ifndef GCD_OP_MAP_H
#define GCD_OP_MAP_H

#define GCD_OP_MAP(XX)                                                                            \
    XX(CONV2D_FORWARD, "conv2d_forward", CONV2D_FORWARD, FIRST)                                   \
    XX(CONV2D_BACKWARD, "conv2d_backward", CONV2D_BACKWARD, FIRST)                                \
    XX(MULTIHOT_ENCODE, "multihot_encode", MULTIHOT_ENCODE, FIRST)                                \
    XX(EMBEDDING_FORWARD, "embedding_forward", EMBEDDING_FORWARD, FIRST)                          \
    XX(EMBEDDING_BACKWARD, "embedding_backward", EMBEDDING_BACKWARD, FIRST)                       \
    XX(EMBEDDING_BAG, "embedding_bag", EMBEDDING_BAG, FIRST)                                      \
    XX(LINEAR_CROSS_ENTROPY, "linear_cross_entropy", LINEAR_CROSS_ENTROPY, FIRST)                 \
    XX(NMMO3_FORWARD, "nmmo3_encode", NMMO3_ENCODE, FIRST)                                        \
    XX(NMMO3_BACKWARD, "nmmo3_encode backward", NMMO3_ENCODE, NEXT)

/* Its other arguments for a row whose SHARE is FIRST, nothing for NEXT. */
#define GCD_OP_IF_FIRST(share, ...) GCD_OP_IF_FIRST_##share(__VA_ARGS__)
#define GCD_OP_IF_FIRST_FIRST(...) __VA_ARGS__
#define GCD_OP_IF_FIRST_NEXT(...)

#endif
