// Preload (NODE_OPTIONS=--require <abs path>/loopback.cjs) that keeps test
// servers on loopback: a `listen(port)` or `listen(port, callback)` call,
// which Node binds to every interface, listens on 127.0.0.1 instead.
// server-everything's streamable HTTP transport calls `app.listen(PORT)`.
"use strict";

const net = require("node:net");

const listen = net.Server.prototype.listen;

net.Server.prototype.listen = function (...args) {
  const portOnly =
    (typeof args[0] === "number" || typeof args[0] === "string") &&
    (args.length === 1 || (args.length === 2 && typeof args[1] === "function"));
  if (portOnly && (typeof args[0] === "number" || /^\d+$/.test(args[0]))) {
    return listen.call(this, Number(args[0]), "127.0.0.1", ...args.slice(1));
  }
  return listen.apply(this, args);
};
