import { describe, expect, it } from "vitest";
import { createDeliveryPacer } from "./delivery-pacer.js";

/** Takes one turn for each of `count` deliverers, recording the order and the loop turn they went in. */
async function deliverAll(perTurn: number, count: number): Promise<{ order: number[]; perLoopTurn: number[] }> {
  const pacer = createDeliveryPacer(perTurn);
  const order: number[] = [];
  const perLoopTurn: number[] = [0];
  // A check-phase callback of its own marks each loop turn: the pacer's slices sit between them.
  let counting = true;
  const mark = (): void => {
    if (!counting) return;
    perLoopTurn.push(0);
    setImmediate(mark);
  };
  setImmediate(mark);
  await Promise.all(
    Array.from({ length: count }, async (_, i) => {
      await pacer.take();
      order.push(i);
      perLoopTurn[perLoopTurn.length - 1]! += 1;
    }),
  );
  counting = false;
  return { order, perLoopTurn };
}

describe("the delivery pacer", () => {
  it("lets at most its slice through per event-loop turn, in arrival order, and everyone through in the end", async () => {
    const { order, perLoopTurn } = await deliverAll(16, 200);
    expect(order).toEqual(Array.from({ length: 200 }, (_, i) => i));
    expect(Math.max(...perLoopTurn)).toBeLessThanOrEqual(16);
    // 200 deliveries at 16 a turn cannot take fewer than 13 turns.
    expect(perLoopTurn.filter((n) => n > 0).length).toBeGreaterThanOrEqual(13);
  });

  it("lets I/O callbacks run while deliveries are still waiting", async () => {
    const pacer = createDeliveryPacer(4);
    const cap = 1_000_000;
    let delivered = 0;
    let ioDone = false;
    // fs.stat's callback is an I/O completion, run in the poll phase: unpaced, deliverers that never
    // wait on I/O would starve it until the cap.
    const { stat } = await import("node:fs");
    stat(".", () => (ioDone = true));
    await Promise.all(
      Array.from({ length: 64 }, async () => {
        while (!ioDone && delivered < cap) {
          await pacer.take();
          delivered++;
        }
      }),
    );
    expect(ioDone).toBe(true);
    expect(delivered).toBeLessThan(cap);
  });

  it("hands out turns again after a quiet spell", async () => {
    const pacer = createDeliveryPacer(2);
    for (let round = 0; round < 3; round++) {
      await Promise.all(Array.from({ length: 5 }, async () => pacer.take()));
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    expect(pacer.take()).toBeUndefined();
  });
});
