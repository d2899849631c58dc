/* error.c - error codes, their names and the per-thread error message. */
#include <stdarg.h>
#include <stdio.h>

#include "internal.h"

/* Per thread, so that concurrent calls on one client never see each other's message. */
static _Thread_local char gpucdc_errbuf[512];

int gpucdc_fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(gpucdc_errbuf, sizeof gpucdc_errbuf, fmt, ap);
    va_end(ap);
    return code;
}

void gpucdc_clear_error(void)
{
    gpucdc_errbuf[0] = '\0';
}

const char *gpucd_errmsg(const gpucd_client *client)
{
    (void)client;
    return gpucdc_errbuf;
}

int gpucdc_fail_nng(int nng_rv, const char *op, const char *what)
{
    int code;
    switch (nng_rv) {
    case NNG_ETIMEDOUT:
        code = GPUCD_ETIMEDOUT;
        break;
    case NNG_ECONNREFUSED:
    case NNG_ENOENT: /* ipc:// path without a listener */
        code = GPUCD_ECONNREFUSED;
        break;
    case NNG_ECLOSED:
    case NNG_ECONNRESET:
    case NNG_ECONNSHUT:
    case NNG_ECANCELED: /* aborted because the connection dropped */
        code = GPUCD_ECLOSED;
        break;
    case NNG_ENOMEM:
        code = GPUCD_ENOMEM;
        break;
    case NNG_EADDRINVAL:
    case NNG_ENOTSUP:
        code = GPUCD_EADDRESS;
        break;
    case NNG_EMSGSIZE:
        code = GPUCD_EPROTO;
        break;
    default:
        code = GPUCD_ETRANSPORT;
        break;
    }
    return gpucdc_fail(code, "%s: %s: %s", op, what, nng_strerror(nng_rv));
}

int gpucdc_status_code(int status)
{
    return status == 0 ? GPUCD_OK : -(GPUCD_EDAEMON_BASE + status);
}

const char *gpucd_strerror(int code)
{
    switch (code) {
    case GPUCD_OK: return "success";
    case GPUCD_EINVAL: return "invalid argument";
    case GPUCD_ENOMEM: return "out of memory";
    case GPUCD_ETIMEDOUT: return "timed out waiting for the daemon";
    case GPUCD_ECONNREFUSED: return "connection refused: no daemon at this URL";
    case GPUCD_ECLOSED: return "connection closed";
    case GPUCD_ESYSTEM: return "system call failed";
    case GPUCD_EPROTO: return "malformed reply from the daemon";
    case GPUCD_ETRANSPORT: return "transport error";
    case GPUCD_EADDRESS: return "invalid or unsupported URL";
    case GPUCD_EUNTRUSTED: return "the daemon or its socket folder is not trusted";
    case GPUCD_EBAD_MESSAGE: return "daemon: malformed request";
    case GPUCD_EVERSION_MISMATCH: return "daemon: protocol version mismatch";
    case GPUCD_EUNKNOWN_OPERATION: return "daemon: unknown operation";
    case GPUCD_EINVALID_ARGUMENT: return "daemon: invalid argument";
    case GPUCD_EOUT_OF_RANGE: return "daemon: out of range";
    case GPUCD_ENOT_FOUND: return "daemon: not found";
    case GPUCD_EPERMISSION_DENIED: return "daemon: permission denied";
    case GPUCD_ERESOURCE_EXHAUSTED: return "daemon: resource exhausted";
    case GPUCD_EUNAVAILABLE: return "daemon: unavailable";
    case GPUCD_EDEVICE: return "daemon: device error";
    case GPUCD_EINTERNAL: return "daemon: internal error";
    case GPUCD_EMESSAGE_TOO_LARGE: return "daemon: reply too large";
    default:
        return code <= -GPUCD_EDAEMON_BASE ? "daemon: unknown status" : "unknown error code";
    }
}

int gpucdc_fail_untrusted(const gpucd_client *c, const char *op, uint64_t uid)
{
    char runs[48];
    if (uid == GPUCDC_UID_UNKNOWN)
        snprintf(runs, sizeof runs, "runs as a uid that cannot be learnt");
    else
        snprintf(runs, sizeof runs, "runs as uid %llu", (unsigned long long)uid);
    return gpucdc_fail(GPUCD_EUNTRUSTED,
                       "%s: daemon at %s %s, expected %llu (GPUCD_TRUST_UID or "
                       "gpucd_options.trust_uid name another to trust); not using it",
                       op, c->url, runs, (unsigned long long)c->trust_uid);
}
