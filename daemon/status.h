/* status.h - the wire's status codes under short names, and the mapping from kernel codes. */
#ifndef GCD_STATUS_H
#define GCD_STATUS_H

#include "gk.h"
#include "gpucd.pb-c.h"

typedef Gpucd__V1__Status gcd_status;

#define GCD_OK GPUCD__V1__STATUS__OK
#define GCD_BAD_MESSAGE GPUCD__V1__STATUS__BAD_MESSAGE
#define GCD_VERSION_MISMATCH GPUCD__V1__STATUS__VERSION_MISMATCH
#define GCD_UNKNOWN_OPERATION GPUCD__V1__STATUS__UNKNOWN_OPERATION
#define GCD_INVALID_ARGUMENT GPUCD__V1__STATUS__INVALID_ARGUMENT
#define GCD_OUT_OF_RANGE GPUCD__V1__STATUS__OUT_OF_RANGE
#define GCD_NOT_FOUND GPUCD__V1__STATUS__NOT_FOUND
#define GCD_PERMISSION_DENIED GPUCD__V1__STATUS__PERMISSION_DENIED
#define GCD_RESOURCE_EXHAUSTED GPUCD__V1__STATUS__RESOURCE_EXHAUSTED
#define GCD_UNAVAILABLE GPUCD__V1__STATUS__UNAVAILABLE
#define GCD_DEVICE_ERROR GPUCD__V1__STATUS__DEVICE_ERROR
#define GCD_INTERNAL GPUCD__V1__STATUS__INTERNAL
#define GCD_MESSAGE_TOO_LARGE GPUCD__V1__STATUS__MESSAGE_TOO_LARGE

enum { GCD_STATUS_COUNT = GPUCD__V1__STATUS__MESSAGE_TOO_LARGE + 1 };

static inline gcd_status gcd_status_from_gk(int code)
{
    switch (code) {
    case GK_OK: return GCD_OK;
    case GK_EINVAL: return GCD_INVALID_ARGUMENT;
    case GK_EDTYPE: return GCD_INVALID_ARGUMENT;
    case GK_ERANGE: return GCD_OUT_OF_RANGE;
    case GK_ENOMEM: return GCD_RESOURCE_EXHAUSTED;
    case GK_EDEVICE: return GCD_DEVICE_ERROR;
    default: return GCD_INTERNAL;
    }
}

/* The enum's name as the schema spells it ("INVALID_ARGUMENT"). */
const char *gcd_status_name(gcd_status s);

#endif
