// A minimal WebSocket server side (RFC 6455) for the tests: Node 20 has a
// WebSocket client but no server. An http(s) server's "upgrade" event
// hands its request and socket to accept(), which answers the handshake
// and returns a connection that reads the client's frames (which must be
// masked) and sends unmasked ones; refuse() answers the upgrade request
// with an ordinary HTTP error instead.
import { createHash } from "node:crypto";

const GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/** Answers an upgrade request with an HTTP error (a JSON body, when it is an object) and closes the socket. */
export function refuse(socket, status, reason, body, headers = {}) {
  const text = typeof body === "string" ? body : JSON.stringify(body);
  const type = typeof body === "string" ? "text/html" : "application/json";
  const lines = [`HTTP/1.1 ${status} ${reason}`, `content-type: ${type}`, `content-length: ${Buffer.byteLength(text)}`, "connection: close"];
  for (const [k, v] of Object.entries(headers)) lines.push(`${k}: ${v}`);
  socket.end(lines.join("\r\n") + "\r\n\r\n" + text);
}

/**
 * Accepts the upgrade: answers 101 with the accept hash of the client's
 * key (no extension, no subprotocol) and returns the connection.
 */
export function accept(req, socket, head) {
  const key = req.headers["sec-websocket-key"];
  const hash = createHash("sha1").update(key + GUID).digest("base64");
  socket.write(["HTTP/1.1 101 Switching Protocols", "Upgrade: websocket", "Connection: Upgrade", `Sec-WebSocket-Accept: ${hash}`, "", ""].join("\r\n"));
  return new Conn(socket, head);
}

/**
 * A server's side of a WebSocket connection. next() resolves with the
 * client's next message ({ type: "binary" | "text", data: Buffer }), or
 * with { type: "close", code, reason } once the client closed (it is
 * answered with the same close). Every frame's mask bit is kept in
 * `masked`.
 */
export class Conn {
  /** Whether each frame the client sent was masked. */
  masked = [];
  /** The size of each message the client sent. */
  sizes = [];
  #buf = Buffer.alloc(0);
  #queue = [];
  #waiting = [];
  #fragments = [];
  #fragmentType = 0;
  #sentClose = false;
  /** Resolves once the socket has closed. */
  ended;

  constructor(socket, head) {
    this.socket = socket;
    this.ended = new Promise((resolve) => socket.on("close", resolve));
    socket.on("error", () => {});
    socket.on("data", (d) => this.#read(d));
    socket.on("close", () => this.#push({ type: "end" }));
    if (head?.length) this.#read(head);
  }

  /** The client's next message. */
  next() {
    const m = this.#queue.shift();
    if (m) return Promise.resolve(m);
    return new Promise((resolve) => this.#waiting.push(resolve));
  }

  sendBinary(data) {
    this.#send(2, Buffer.from(data));
  }

  sendText(text) {
    this.#send(1, Buffer.from(typeof text === "string" ? text : JSON.stringify(text)));
  }

  /** Sends a close frame; the client's answer then ends the socket. */
  close(code = 1000, reason = "") {
    const p = Buffer.alloc(2 + Buffer.byteLength(reason));
    p.writeUInt16BE(code, 0);
    p.write(reason, 2);
    this.#send(8, p);
    this.#sentClose = true;
  }

  #send(opcode, payload) {
    let header;
    if (payload.length < 126) header = Buffer.from([0x80 | opcode, payload.length]);
    else if (payload.length < 65536) {
      header = Buffer.alloc(4);
      header[0] = 0x80 | opcode;
      header[1] = 126;
      header.writeUInt16BE(payload.length, 2);
    } else {
      header = Buffer.alloc(10);
      header[0] = 0x80 | opcode;
      header[1] = 127;
      header.writeBigUInt64BE(BigInt(payload.length), 2);
    }
    if (!this.socket.destroyed) this.socket.write(Buffer.concat([header, payload]));
  }

  #push(m) {
    const w = this.#waiting.shift();
    if (w) w(m);
    else this.#queue.push(m);
  }

  #read(d) {
    this.#buf = Buffer.concat([this.#buf, d]);
    for (;;) {
      const b = this.#buf;
      if (b.length < 2) return;
      const fin = (b[0] & 0x80) !== 0;
      const opcode = b[0] & 0x0f;
      const masked = (b[1] & 0x80) !== 0;
      let len = b[1] & 0x7f;
      let at = 2;
      if (len === 126) {
        if (b.length < 4) return;
        len = b.readUInt16BE(2);
        at = 4;
      } else if (len === 127) {
        if (b.length < 10) return;
        len = Number(b.readBigUInt64BE(2));
        at = 10;
      }
      const maskAt = at;
      if (masked) at += 4;
      if (b.length < at + len) return;
      const payload = Buffer.from(b.subarray(at, at + len));
      if (masked) for (let i = 0; i < payload.length; i++) payload[i] ^= b[maskAt + (i % 4)];
      this.#buf = b.subarray(at + len);
      this.masked.push(masked);
      this.#frame(fin, opcode, payload);
    }
  }

  #frame(fin, opcode, payload) {
    if (opcode === 8) {
      const code = payload.length >= 2 ? payload.readUInt16BE(0) : 1005;
      const reason = payload.subarray(2).toString("utf8");
      if (!this.#sentClose) {
        this.#send(8, payload.subarray(0, 2)); // the close, answered
        this.#sentClose = true;
      }
      this.socket.end();
      this.#push({ type: "close", code, reason });
      return;
    }
    if (opcode === 9) return this.#send(10, payload); // a ping
    if (opcode === 10) return;
    if (opcode !== 0) this.#fragmentType = opcode;
    this.#fragments.push(payload);
    if (!fin) return;
    const data = Buffer.concat(this.#fragments);
    this.#fragments = [];
    this.sizes.push(data.length);
    this.#push({ type: this.#fragmentType === 1 ? "text" : "binary", data });
  }
}
