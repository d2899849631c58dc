#!/usr/bin/env python3
"""A small language-model-style training loop whose final projection's loss and gradients come
from the daemon's fused linear cross entropy (the N x V logits never exist in this process).

Model: token embedding (V, D) -> h = tanh(emb . W) -> logits h . C^T, trained by SGD to predict
the next token of a fixed rule (next = (5 * token + 3) mod V, with 10 % noise).  The daemon
computes the loss, d(h) and d(C) (linear_cross_entropy) and the embedding's gradient
(embedding_backward); numpy does the rest.  At the first and last step the daemon's loss and
gradients are checked against a float64 numpy reference: exit status 1 when they differ, or
when the loss did not fall.

    python3 client/python/examples/train_loss.py --steps 200
"""
import argparse
import sys

import numpy as np

import gpucd


def reference(h, C, targets):
    """Mean cross entropy of h . C^T and its gradients, in float64."""
    h, C = h.astype(np.float64), C.astype(np.float64)
    z = h @ C.T
    z -= z.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    n = len(targets)
    loss = -np.log(p[np.arange(n), targets]).mean()
    p[np.arange(n), targets] -= 1.0
    p /= n
    return loss, p @ C, p.T @ h


def rel(a, b):
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / max(np.linalg.norm(b), 1e-30))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default=None, help="the daemon (default $GPUCD_URL, else the "
                    "library's default)")
    ap.add_argument("--vocab", type=int, default=97)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=256, help="tokens a step")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--lr", type=float, default=0.5)
    args = ap.parse_args()
    V, D, N = args.vocab, args.dim, args.tokens
    rng = np.random.default_rng(0)
    emb = (rng.standard_normal((V, D)) * 0.5).astype(np.float32)
    W = (rng.standard_normal((D, D)) / np.sqrt(D)).astype(np.float32)
    C = (rng.standard_normal((V, D)) * 0.1).astype(np.float32)
    first = last = None
    failed = False
    with gpucd.Client(args.url) as client:
        for step in range(args.steps):
            x = rng.integers(0, V, N)
            targets = (5 * x + 3) % V
            noisy = rng.random(N) < 0.1
            targets[noisy] = rng.integers(0, V, noisy.sum())
            a = emb[x] @ W
            h = np.tanh(a).astype(np.float32)
            r = client.linear_cross_entropy(h, C, targets, dE=True, dC=True)
            loss = float(r.loss)
            if step in (0, args.steps - 1):
                want_loss, want_dh, want_dC = reference(h, C, targets)
                errs = (abs(loss - want_loss) / want_loss, rel(r.dE, want_dh), rel(r.dC, want_dC))
                ok = max(errs) <= 1e-4
                failed |= not ok
                print(f"step {step}: loss {loss:.5f}, numpy {want_loss:.5f}; relative errors "
                      f"loss {errs[0]:.1e}, dh {errs[1]:.1e}, dC {errs[2]:.1e} "
                      f"{'ok' if ok else 'MISMATCH'}")
            elif step % 20 == 0:
                print(f"step {step}: loss {loss:.5f}")
            first = loss if first is None else first
            last = loss
            # Back through tanh and W in numpy; the embedding's gradient from the daemon.
            da = r.dE * (1.0 - h * h)
            dW = (emb[x].T @ da).astype(np.float32)
            demb = client.embedding_backward(x.astype(np.int64), (da @ W.T).astype(np.float32),
                                             vocab=V)
            C -= args.lr * r.dC
            W -= args.lr * dW
            emb -= args.lr * demb
    print(f"loss {first:.4f} -> {last:.4f} over {args.steps} steps")
    if last >= first:
        print("the loss did not fall", file=sys.stderr)
        failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
