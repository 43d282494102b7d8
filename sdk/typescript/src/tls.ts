// How the client trusts an https server (HAREBOX_CA or the `ca` option):
// a PEM file of CA certificates, or a "sha256:" pin of the server's
// certificate. Node's global fetch takes neither, so such a client sends
// its requests with the undici package's fetch and an Agent of its own;
// its terminal sessions (openPty: undici's WebSocket) use the same Agent.

import { X509Certificate } from "node:crypto";
import { readFileSync } from "node:fs";
import type { TLSSocket } from "node:tls";

import type * as Undici from "undici";

import { HareBoxError } from "./errors.js";

/** The trust an https client was given, checked. */
export interface Trust {
  /** Where it came from, for messages: "HAREBOX_CA" or "the ca option". */
  source: string;
  /** The PEM text of the CA file, when it is one. */
  caPem?: string;
  /** The CA file's path, when it is one. */
  caFile?: string;
  /** The pinned fingerprint (64 lowercase hex digits), when it is one. */
  pin?: string;
}

const PIN_PREFIX = "sha256:";
const PEM_BLOCK = /-----BEGIN CERTIFICATE-----[\s\S]*?-----END CERTIFICATE-----/g;

/** The code of the error a connection whose certificate is not the pinned one fails with. */
export const PIN_MISMATCH = "HAREBOX_CERT_PIN_MISMATCH";

/**
 * Checks a HAREBOX_CA / `ca` value (`source` names which) and returns the
 * trust it stands for; a bad value throws a HareBoxError with code
 * "invalid" and field "ca".
 */
export function parseTrust(value: string, source: string): Trust {
  const bad = (why: string): HareBoxError => new HareBoxError(0, "invalid", `${source}: ${why}`, "ca");
  if (value.startsWith(PIN_PREFIX)) {
    const hex = value.slice(PIN_PREFIX.length).replaceAll(":", "").toLowerCase();
    if (!/^[0-9a-f]{64}$/.test(hex)) {
      throw bad(`${JSON.stringify(value)} is not a fingerprint: it is sha256: and 64 hex digits (":" between bytes allowed)`);
    }
    return { source, pin: hex };
  }
  let text: string;
  try {
    text = readFileSync(value, "utf8");
  } catch (err) {
    const code = (err as { code?: unknown }).code;
    const why = code === "ENOENT" ? "no such file" : code === "EISDIR" ? "a directory, not a file" : err instanceof Error ? err.message : String(err);
    throw bad(`cannot read the CA file ${value}: ${why}`);
  }
  const blocks = text.match(PEM_BLOCK) ?? [];
  if (blocks.length === 0) {
    throw bad(`no PEM certificate ("-----BEGIN CERTIFICATE-----") in ${value}`);
  }
  blocks.forEach((block, i) => {
    try {
      new X509Certificate(block);
    } catch {
      throw bad(`certificate ${i + 1} in ${value} is not a valid PEM certificate`);
    }
  });
  return { source, caPem: blocks.join("\n") + "\n", caFile: value };
}

/** How the trust reads in an error message. */
export function describeTrust(trust: Trust | undefined): string {
  if (!trust) return "by Node's default CA certificates (set HAREBOX_CA or the ca option to trust another)";
  if (trust.pin) return `${trust.source} pins sha256:${trust.pin}`;
  return `with the CA certificates of ${trust.source} (${trust.caFile})`;
}

/**
 * The undici Agent whose connections trust as `trust` says: with a CA
 * file, Node's verification against those roots (host name included);
 * with a pin, no chain or host name check, but each connection's peer
 * certificate must have the pinned SHA-256 fingerprint, else the socket is
 * destroyed before any request is written on it. It is made (and undici
 * loaded) on the first call of the returned function; later calls return
 * the same Agent.
 */
export function trustingAgent(trust: Trust): () => Promise<Undici.Agent> {
  let ready: Promise<Undici.Agent> | undefined;
  const load = async (): Promise<Undici.Agent> => {
    const undici = await import("undici");
    if (trust.pin) {
      const pin = trust.pin;
      // The pin is the trust: no session resumption, so that every
      // connection shows the certificate it is checked against.
      const base = undici.buildConnector({ rejectUnauthorized: false, maxCachedSessions: 0 });
      const connect: Undici.buildConnector.connector = (opts, callback) => {
        base(opts, (err, socket) => {
          if (err || !socket) return callback(err ?? new Error("no socket"), null);
          if (opts.protocol === "https:") {
            const cert = (socket as TLSSocket).getPeerCertificate?.();
            const got = typeof cert?.fingerprint256 === "string" ? cert.fingerprint256.replaceAll(":", "").toLowerCase() : "";
            if (got !== pin) {
              const e = Object.assign(
                new Error(
                  got
                    ? `the server's certificate was not trusted: its fingerprint sha256:${got} is not the one ${trust.source} pins (sha256:${pin})`
                    : `the server's certificate was not trusted: it presented none to check against the pin of ${trust.source} (sha256:${pin})`,
                ),
                { code: PIN_MISMATCH },
              );
              socket.destroy(e);
              return callback(e, null);
            }
          }
          callback(null, socket);
        });
      };
      return new undici.Agent({ connect });
    }
    return new undici.Agent({ connect: { ca: trust.caPem ?? "", rejectUnauthorized: true } });
  };
  return () => (ready ??= load());
}

/**
 * A fetch that sends every request through `agent` (by default a
 * {@link trustingAgent} of `trust`'s own): undici's fetch, which takes the
 * global fetch's arguments plus the dispatcher.
 */
export function trustingFetch(trust: Trust, agent: () => Promise<Undici.Agent> = trustingAgent(trust)): typeof fetch {
  return (async (input: Parameters<typeof fetch>[0], init?: RequestInit) => {
    const [undici, dispatcher] = await Promise.all([import("undici"), agent()]);
    return (await undici.fetch(input as Parameters<typeof Undici.fetch>[0], { ...(init as Undici.RequestInit), dispatcher })) as unknown as Response;
  }) as typeof fetch;
}

/**
 * Whether err (or an error it was caused by) is a TLS connection refused
 * because the server's certificate was not trusted: a certificate
 * verification error from Node (wrong CA, self-signed, expired, another
 * host's name) or a pin that does not match.
 */
export function certificateError(err: unknown): Error | undefined {
  for (let e = err, depth = 0; e instanceof Error && depth < 8; e = (e as { cause?: unknown }).cause, depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code !== "string") continue;
    if (code === PIN_MISMATCH || code === "ERR_TLS_CERT_ALTNAME_INVALID" || VERIFY_CODES.test(code)) return e;
  }
  return undefined;
}

// OpenSSL's X509 verification results, as Node names them in err.code.
const VERIFY_CODES =
  /^(UNABLE_TO_GET_ISSUER_CERT(_LOCALLY)?|UNABLE_TO_VERIFY_LEAF_SIGNATURE|UNABLE_TO_DECRYPT_CERT_SIGNATURE|UNABLE_TO_DECODE_ISSUER_PUBLIC_KEY|CERT_(SIGNATURE_FAILURE|NOT_YET_VALID|HAS_EXPIRED|REVOKED|UNTRUSTED|REJECTED|CHAIN_TOO_LONG)|ERROR_IN_CERT_(NOT_BEFORE|NOT_AFTER)_FIELD|DEPTH_ZERO_SELF_SIGNED_CERT|SELF_SIGNED_CERT_IN_CHAIN|INVALID_CA|PATH_LENGTH_EXCEEDED|INVALID_PURPOSE|HOSTNAME_MISMATCH)$/;
