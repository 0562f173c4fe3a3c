import type { ClientSession, Collection, MongoClient, MongoClientOptions } from 'mongodb';

export interface LockOptions {
  /** Lease asked for on acquire and every renewal. Default 30000. */
  leaseMS?: number;
  /** How long acquire lets lockgate wait for locks held by others. Default 30000. */
  waitMS?: number;
  /** Renewal period. Default leaseMS / 3. */
  renewEveryMS?: number;
  /** The lock counts as lost this long before its lease ends. Default leaseMS / 5. */
  marginMS?: number;
  /** No background renewal: call renew() yourself. */
  noRenew?: boolean;
  /** Sends of acquire and release for failures that may be retried. Default 3. */
  attempts?: number;
}

export interface HeldLock { _id: unknown; token: bigint; expiresAt: Date; lastError?: string }

export class Lock {
  /** The holder tag others see for these locks (holder.tag); not the session id. */
  readonly holderTag: string;
  readonly token: bigint | null;
  readonly locks: HeldLock[];
  readonly lost: Promise<LockLostError>;
  readonly signal: AbortSignal;
  readonly error: LockgateError | null;
  renew(): Promise<void>;
  release(errText?: string): Promise<void>;
}

export function connect(uri: string, appName: string, options?: MongoClientOptions): MongoClient;
export function acquire(session: ClientSession, coll: Collection, ids: unknown[], opts?: LockOptions): Promise<Lock>;
export function tryAcquire(session: ClientSession, coll: Collection, ids: unknown[], opts?: LockOptions): Promise<Lock>;
export function withLock<T>(session: ClientSession, coll: Collection, ids: unknown[], opts: LockOptions | undefined,
  fn: (lock: Lock, signal: AbortSignal) => Promise<T>): Promise<T>;

export class LockgateError extends Error {
  code: number | null; codeName: string | null; reason: string | null; ns: string | null;
  ids: unknown[]; holder: { app: string; tag: string; client?: string; user?: string; expiresAt: Date } | null;
  command: string | null;
}
export class LockBusyError extends LockgateError {}
export class LockStoreUnavailableError extends LockgateError {}
export class LockTimeoutError extends LockgateError {}
export class LockNotHeldError extends LockgateError {}
export class InvalidLockRequestError extends LockgateError {}
export class LockUnauthorizedError extends LockgateError {}
export class NotProtectedError extends LockgateError {}
export class LockLostError extends LockgateError {}
