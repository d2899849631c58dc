/* status.c - status names from the schema itself, so they never drift from the enum. */
#include "status.h"

const char *gcd_status_name(gcd_status s)
{
    const ProtobufCEnumValue *v =
        protobuf_c_enum_descriptor_get_value(&gpucd__v1__status__descriptor, (int)s);
    return v != NULL ? v->name : "UNKNOWN_STATUS";
}
