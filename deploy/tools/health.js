// grpc.health.v1.Health/Check over @grpc/grpc-js without generated code:
// the request (service "") is the empty message and the response is one
// enum field, so both are encoded by hand.
'use strict';

const grpc = require('@grpc/grpc-js');

const SERVING_STATUS = ['UNKNOWN', 'SERVING', 'NOT_SERVING', 'SERVICE_UNKNOWN'];

// Resolves to 'SERVING', 'NOT_SERVING', ...; rejects with the gRPC error.
function checkHealth(address, timeoutMs = 2000) {
  const client = new grpc.Client(address, grpc.credentials.createInsecure());
  return new Promise((resolve, reject) => {
    client.makeUnaryRequest('/grpc.health.v1.Health/Check', (b) => b,
        (b) => b, Buffer.alloc(0), {deadline: Date.now() + timeoutMs},
        (error, response) => {
          client.close();
          if (error) return reject(error);
          // Field 1, varint: 0x08 then the status; absent means 0.
          const status = response.length >= 2 && response[0] === 0x08 ?
            response[1] : 0;
          resolve(SERVING_STATUS[status] ?? `status ${status}`);
        });
  });
}

// Polls until SERVING or the deadline; resolves true or false.
async function waitServing(address, timeoutMs) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    try {
      if (await checkHealth(address, 1000) === 'SERVING') return true;
    } catch (e) {
      // Not listening yet.
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  return false;
}

module.exports = {checkHealth, waitServing};
