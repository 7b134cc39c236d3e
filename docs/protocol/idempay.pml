/*
 * idempay.pml -- the payment protocol of SPEC.md §2-4, as SPIN sees it.
 *
 * One idempotency key (one merchant, one payload). A terminal runs the SDK's state machine
 * (journal, create, lookup, resend after 404, abort at the deadline, crash + recover())
 * against two API workers and a completer that share one database. A create claims the
 * key (durable, lease token 1) and writes ONE 0200 to the acquirer link, never resent:
 * answered → the guarded finish; no answer within the acquirer timeout, or the connection
 * broken after the write → the key settles declined / acquirer_timeout with its reversal
 * advice queued in the same commit; provably never sent → the claim is dropped (503), or,
 * once the create has answered 202, settled in doubt like a timeout. The create answers
 * 202 once the answer time has passed; the work goes on. The completer settles an expired
 * lease in doubt (never a second 0200); an abort past the claim's answer time takes the
 * lease, fences the key and queues the advice in one commit. The acquirer is a ghost: the
 * 0200's fate there (approved, or lost on its way) is recorded when it is written; the
 * acquirer boundary itself (a lossy network, the advice worker, REVERSED_FIRST) is
 * acquirer.pml's. -DOFFLINE: a stored sale forwarded as an advice, sent as a 0220 and
 * repeated (0221) by the completer until the acquirer answers.
 *
 * The world misbehaves within bounds: the network drops, duplicates, delays and reorders;
 * any server actor can die between two steps; the terminal can die and reboot; a lease
 * holder can stall past its lease; the acquirer link can fail (a 0200 that never left, one
 * lost on its way, an answer that never comes back).
 *
 * Each SQL statement -- or each committed transaction, where the code groups statements in
 * one `async with atomic(...)` block -- is one atomic step: nothing interleaves with it, and a
 * crash falls between two of them, which is exactly "the open transaction rolls back".
 * README.md maps every step to the function and the statement it stands for.
 *
 * Properties (ltl blocks at the end; scripts/verify.sh checks each one):
 *   a  at most one 0200 per key leaves idempay (contract §2.9, §3.8)
 *   b  the key never has both a transaction and a tombstone
 *   c  a payment the terminal reports approved/declined exists exactly once, with that
 *      status; one it reports aborted never exists
 *   d  the journal entry ends definitive and the key leaves `processing` (liveness,
 *      weak fairness; the bounded faults are eventually spent)
 *   e  a stale worker (its lease token taken over) never commits
 *   f  once the key is settled, an approval at the acquirer that no queued reversal advice
 *      undoes stands iff the key has an approved transaction (a queued advice counts as
 *      applied: its delivery over the lossy link is acquirer.pml's m and n)
 *   g  a payment the terminal reports rejected (a create attempt's 408/401/413/proxy 4xx)
 *      was never processed and is not being processed
 *   h  recover() never sells: a payment whose terminal died before sending it (the cashier
 *      ran the sale again) is never charged
 *   i  -DRETENTION: a fenced key is never processed later, even after the purge of its
 *      tombstone; the server's clock, the request's timestamp, clock_skew
 *   j  -DTWO_DRIVERS: every driver of the key (the terminal, and a second Client running
 *      recover() on the same journal) reports what the ledger says
 *   k  -DOFFLINE: store and forward stays exactly once: a payment the terminal
 *      sold offline is never aborted by it and never fenced as expired; forwarded (same
 *      key, an advice), its journal entry ends with what the ledger says -- RESOLVED with
 *      the one transaction, or REPORTED with none
 *
 * Mutants, one flag each, so that the model and its mutants never drift apart:
 *   -DMUTANT_NO_LEASE_TOKEN     the final write is guarded by the state, not the lease token
 *   -DMUTANT_404_GIVES_UP       SDK: a lookup 404 ends the payment as not processed, no abort
 *   -DMUTANT_CHECK_THEN_INSERT  store.fence reads, then inserts blindly in a later statement
 *   -DMUTANT_REDRIVE            a take-over sends the key's 0200 again instead of settling it
 *                               in doubt (the re-drive of the in-process issuer)
 *   -DMUTANT_NO_RECOVER         SDK: an entry left in doubt is never recovered (liveness)
 *   -DMUTANT_FENCE_WITHOUT_ADVICE  an abort's fence queues no reversal advice
 *   -DMUTANT_RELEASE_IN_DOUBT   a 0200 written but unanswered is released like one never
 *                               sent (claim dropped, 503)
 *   -DMUTANT_REJECT_IS_OUTCOME  SDK: a later attempt's rejection ends the payment (pre-fix)
 *   -DMUTANT_RECOVER_RESENDS    SDK: recover() looks a never-sent entry up and sends it on 404
 *   -DMUTANT_PURGE_AT_RETENTION purge tombstones at the retention, without the tolerance
 *   -DMUTANT_NO_FUTURE_REFUSAL  accept a timestamp however far ahead (no 422 clock_skew)
 *   -DMUTANT_PER_INSTANCE_DRIVER SDK: the "who drives this key" claim is per Client instance
 *   -DMUTANT_OFFLINE_AFTER_SEND SDK: a create whose answer was lost is sold offline too
 *   -DMUTANT_RECOVER_FENCES_STORED SDK: recover() settles a stored payment like one in doubt
 */

/* ======================================================================== bounds */
#ifndef NET_FAULTS
#define NET_FAULTS 1      /* drops, duplicates, delays, early timeouts, connect errors */
#endif
#ifndef CRASHES
#define CRASHES 1         /* deaths of server actors (worker 0, worker 1, completer) */
#endif
#ifndef T_CRASHES
#define T_CRASHES 1       /* deaths of the terminal (then recover()) */
#endif
#ifndef PAUSES
#define PAUSES 1          /* a live lease holder stalls until its lease has run out */
#endif
#ifndef ACQ_FAULTS
#define ACQ_FAULTS 1      /* acquirer-link failures: a 0200 (0220) that never left (no
                             connection), one lost on its way, an answer lost or late */
#endif
#ifndef REJECTS
#define REJECTS 0         /* create attempts refused before processing (408/401/413/proxy
                             4xx). 0 by default: the checks that want them say so */
#endif
/* The budgets above are the defaults; the environment variables PML_NET_FAULTS,
   PML_CRASHES, PML_T_CRASHES, PML_PAUSES, PML_ACQ_FAULTS and PML_REJECTS override them when
   pan starts (configure(), below), so that one compiled pan serves every bound
   (scripts/verify.sh). spin's simulator does not run that C code: replay a trail with the
   -D values it was found with, and no environment.
   -DACQUIRER_DOWN: tok_issuer_down, the acquirer records every 0200 and never answers. */
#define NQ     2          /* requests on the wire */
#define NEP    4          /* connection ids the terminal cycles through */
#define MAXTOK 16         /* lease tokens: asserted, never reached */

/* -DNO_EXPIRY: no create is ever too late (the SDK's send_expires_at=False, captured_at
   recent): a subset of the runs, used to aim MUTANT_CHECK_THEN_INSERT at abort's fence */

/* ======================================================================== values */
/* idempotency_key.state; NOKEY: no row */
#define NOKEY 0
#define PROC  1
#define DONE  2
#define ABRT  3
#define EXPD  4

/* transaction.status, and the reply codes that carry a transaction */
#define ST_NONE     0
#define ST_APPROVED 1
#define ST_DECLINED 2

#define R_NONE       0  /* no reply: timeout, reset, connect error; also a 503 (in doubt
                           for the SDK, like a lost answer: contract §4's table) */
#define R_APPROVED   1  /* 200/201 (or the replay) with the transaction, approved */
#define R_DECLINED   2  /*   ... declined */
#define R_PROCESSING 3  /* 202 */
#define R_BUSY       4  /* 409 request_in_progress */
#define R_FENCED     5  /* 410 aborted/expired, or abort's 200 {"status": aborted|expired} */
#define R_NOTFOUND   6  /* 404 */
#define REP_ABORTED  7  /* what the SDK reported: PaymentAborted */
#define R_REJECTED   8  /* a create attempt refused before anything was processed: 408,
                           401, 413, 422 clock_skew, a proxy's 4xx (nothing stored) */
#define REP_REJECTED 9  /* what the SDK reported: the typed APIError of a rejection
                           (journal entry ended, the app shows "failed") */
#define REP_FAILED  10  /* what the SDK reported: InvalidTransition from its own journal
                           (an IdempayError: the app shows "failed") -- TWO_DRIVERS only */
#define REP_OFFLINE 11  /* what the SDK reported: approved offline (the terminal's own
                           answer; the payment is STORED) -- OFFLINE only */
#define R_TOO_OLD   12  /* 422 advice_too_old: an advice older than the retention window,
                           nothing stored -- OFFLINE with RETENTION */

/* the acquirer's authorization for the key's RRN (the same values as transaction.status:
   a 0210 carries it) */
#define AU_NONE 0         /* no decision: no 0200 arrived (or tok_issuer_down) */
#define AU_APPR 1         /* approved (response code 00) */
#define AU_DECL 2         /* declined: only REVERSED_FIRST here (a 0200 after its advice) */

/* journal_entry.state */
#define J_NONE     0
#define J_PENDING  1
#define J_SENT     2
#define J_IN_DOUBT 3
#define J_RESOLVED 4
#define J_ABORTED  5
#define J_STORED   6      /* sold offline, owed to the server: forwarded, never aborted */
#define J_REPORTED 7      /* a stored payment the server refused for good (final) */

/* what the terminal waits for before it asks again (see README.md, "Abstractions") */
#define W_NONE 0
#define W_PROC 1          /* after a 202/409: until the key leaves `processing` */
#define W_LIVE 2          /* after abort's 409: until the abort could take over, or the key
                             settles */

/* where a server actor goes after a step */
#define N_DONE   0
#define N_SEND   1        /* write the 0200 (0220, 0221) and wait for its answer */
#define N_SETTLE 2        /* settle in doubt (the completer, a create's retry) */
#define N_ABORT  3        /* the abort's fence, after its take-over */
#define N_FENCE  4        /* MUTANT_CHECK_THEN_INSERT: the blind tombstone write */
#define N_NEVER  5        /* the 0200 provably never left (NeverSent) */

#define OWNED(t) (k_state == PROC && k_tok == (t))
#ifdef MUTANT_NO_LEASE_TOKEN
#define COMPLETE_GUARD(t) (k_state == PROC)
#else
#define COMPLETE_GUARD(t) OWNED(t)
#endif

mtype = { CREATE, LOOKUP, ABORT, ADVICE };   /* ADVICE: a create with entry_mode offline */

/* ======================================================================== the database */
byte k_state = NOKEY;     /* idempotency_key row:  state */
byte k_tok = 0;           /*   lease_token */
bool k_live = 0;          /*   lease_until > now */
bool claim_old = 0;       /*   now >= created_at + IDEMPAY_ANSWER_WITHIN + 0.5 s */
byte t_count = 0;         /* transaction rows (one charge ledger entry each) for the key */
byte t_status = ST_NONE;  /*   transaction.status */
bool adv = 0;             /* acquirer_advice: a reversal advice (0420) queued for the key;
                             counted as applied by the acquirer (f; acquirer.pml's n is its
                             delivery) */
byte stale_commits = 0;   /* ghost: commits by an actor whose token was no longer current */
#ifdef OFFLINE
bool k_adv = 0;           /*   request: the key holds an offline sale (entry_mode offline) */
#define KADV k_adv
#else
#define KADV 0
#endif

/* ======================================================================== the acquirer (ghost) */
byte a_sent = 0;          /* ghost: 0200s written to the acquirer link for the key (a) */
byte a_auth = AU_NONE;    /* ghost: the acquirer's decision for the key's RRN */

/* ======================================================================== the terminal */
byte j_state = J_NONE;    /* the durable journal entry */
byte reported = R_NONE;   /* what the SDK returned or raised to its caller */
bool t_deadline = 0;      /* the payment's deadline (= the body's expires_at) has passed */
byte t_cur = NEP;         /* the connection the terminal is waiting on; NEP: none */
bool unsent_at_boot = 0;  /* ghost: the terminal died before its first send (journal still
                             PENDING), so the cashier, who saw it die, ran the sale again
                             under a new key: this payment must never be charged (h) */

/* ======================================================================== retention */
/* -DRETENTION: the server's clock, the request's timestamp and the tombstone purge.
   Time in units of the clock-skew tolerance: TOL = 1, retention RET = 2 (the ratio does not
   matter, only the order of the bounds; README.md, "Retention"). The payment starts at
   server time 0; its captured_at / UUIDv7 time (one per payment, stamped at Journal.begin)
   is t_stamp: the terminal's clock ahead by 0..TOL (-DSKEW_BEYOND: also TOL + 1). */
#ifdef RETENTION
#define TOL  1
#define RET  2
#ifdef MUTANT_PURGE_AT_RETENTION
#define KEEP RET          /* the pre-fix purge: tombstones older than the retention */
#else
#define KEEP (RET + TOL)  /* retention.purge: older than retention + tolerance */
#endif
#define CMAX 5            /* the server clock stops here (README.md, "Bounds") */
byte clk = 0;             /* the server's clock (now) */
byte t_stamp = 0;         /* the request's captured_at / UUIDv7 time, on the server's scale */
byte k_tomb = 0;          /* the tombstone's updated_at */
bool purged = 0;          /* ghost: a tombstone of the key was purged */
#define TOMB_AT k_tomb = clk
#else
#define TOMB_AT skip
#endif

/* ======================================================================== two drivers */
/* -DTWO_DRIVERS: a second Client (another thread or process) on the same journal runs
   recover() while the terminal drives the payment. j_owner is the journal lease of the fix
   (contract §4: one driver per key across clients and processes); under
   -DMUTANT_PER_INSTANCE_DRIVER nobody looks at it (the claim was per Client instance). */
#ifdef TWO_DRIVERS
#ifndef J_STALLS
#define J_STALLS 1        /* the terminal stalls past its journal lease (GC, swap, SIGSTOP) */
#endif
byte j_owner = 0;         /* journal lease: 0 none, 1 the terminal, 2 the second driver */
byte j_out = R_NONE;      /* the outcome the journal entry records, once definitive */
byte reported2 = R_NONE;  /* what the second driver's recover() returned for the key */
byte j_stalls = J_STALLS;
#ifdef MUTANT_PER_INSTANCE_DRIVER
#define J_MINE(d) (j_state < J_RESOLVED)   /* only the journal's own transition check */
#else
#define J_MINE(d) (j_owner == (d))         /* Journal.transition WHERE lease_owner = me */
#endif
#endif

/* ======================================================================== offline */
/* -DOFFLINE: the terminal sells under an offline policy (contract §4.12). A sale whose
   attempts all failed to connect (the model's connect error: nothing went on the wire) may
   be accepted offline -- journal STORED, the SDK returns approved-offline -- or refused by
   the policy's limits (OfflineLimitError: aborted, never sent). The stored payment is then
   forwarded (the next call, or recover() after a reboot) under the same key as an advice:
   looked up after a lost answer, resent after a 404, never aborted. */
#ifdef OFFLINE
bool sold_offline = 0;    /* ghost: the terminal sold this payment offline */
byte stored_aborts = 0;   /* ghost: aborts the terminal sent for a payment it sold offline */
byte fwd_out = R_NONE;    /* the server's answer the forward recorded (RESOLVED/REPORTED) */
#endif

/* ======================================================================== the network */
chan req = [NQ] of { mtype, byte };   /* (endpoint, connection id) */
byte mbox = R_NONE;                   /* the response on the terminal's open connection */
byte inuse[NEP];                      /* requests on the wire or in a worker, per connection */

/* ======================================================================== fault budgets */
byte net_faults = NET_FAULTS;
byte crashes = CRASHES;
byte t_crashes = T_CRASHES;
byte pauses = PAUSES;
byte acq_faults = ACQ_FAULTS;
byte rejects = REJECTS;
bool crash[3];            /* set by Chaos: that actor dies before its next step */
bool busy[3];             /* the actor is handling a request or its work (or, the
                             completer, a key) */
bool t_crash;

c_decl {
  /* a fault budget from the environment (see "bounds"), or the compiled default */
  int pml_budget(const char *name, int dflt) {
    const char *v = getenv(name);
    char *end;
    long n;
    if (v == NULL || *v == '\0') return dflt;
    n = strtol(v, &end, 10);
    if (*end != '\0' || n < 0 || n > 9) {
      fprintf(stderr, "idempay.pml: bad %s=%s (0..9)\n", name, v);
      exit(2);
    }
    return (int) n;
  }
}

/* Read the bounds from the environment: the terminal's first step, before any fault can
   be injected (every fault needs a request, a claim or a journal entry first). */
inline configure() {
  c_code {
    now.net_faults = pml_budget("PML_NET_FAULTS", now.net_faults);
    now.crashes = pml_budget("PML_CRASHES", now.crashes);
    now.t_crashes = pml_budget("PML_T_CRASHES", now.t_crashes);
    now.pauses = pml_budget("PML_PAUSES", now.pauses);
    now.acq_faults = pml_budget("PML_ACQ_FAULTS", now.acq_faults);
    now.rejects = pml_budget("PML_REJECTS", now.rejects);
  }
}

/* ======================================================================== server actors */
#define me        _pid                    /* 0, 1: the API workers; 2: the completer */
#define completer (_pid == 2)

inline stale_check(t) {
  if
  :: k_tok != (t) -> stale_commits++
  :: else
  fi
}

/* The HTTP answer to the request, once: delivered if the terminal still waits on that
   connection, else lost. The completer has no client. A create that answered 202 goes on
   with its work (busy) and answers nothing more. */
inline reply() {
  if
  :: !completer && !answered ->
       if
       :: ep == t_cur && mbox == R_NONE -> mbox = code
       :: else                            /* that connection is closed: the answer is lost */
       fi;
       inuse[ep]--; answered = 1
  :: else
  fi
}

/* The answer, and the end of the request's work. */
inline respond() {
  reply();
  busy[me] = 0; ep = 0; code = 0; tok = 0; ans = 0; nxt = 0; top = 0; answered = 0
}

/* recovery.take_over -> store.take_over: UPDATE … SET lease_token = seen + 1, lease_until =
   now + lease WHERE state = 'processing' AND lease_token = seen -- merged with the read that
   saw the expired lease (README.md, "Abstractions": a failed compare-and-set has no
   effect) */
inline take_over() {
  k_tok++; k_live = 1; tok = k_tok;
  assert(k_tok < MAXTOK)
}

/* recovery.recover: take over an expired lease, then settle it in doubt -- never a second
   0200; an offline sale's 0220 is repeated (0221) instead. MUTANT_REDRIVE: the take-over
   drives the key again, a second 0200 (the in-process issuer's re-drive). */
inline recover() {
  take_over();
#ifdef MUTANT_REDRIVE
  nxt = N_SEND
#else
  if
  :: KADV -> nxt = N_SEND
  :: else -> nxt = N_SETTLE
  fi
#endif
}

/* existing(record) on the row as it is now: answer from it, or recover a key whose lease
   ran out (its owner vanished) */
inline existing() {
  if
  :: k_state == ABRT || k_state == EXPD -> code = R_FENCED; respond()
  :: k_state == DONE -> code = t_status; respond()   /* replay the stored response */
  :: k_state == PROC && k_live -> code = R_BUSY; respond()
  :: k_state == PROC && !k_live -> recover()
#ifndef RETENTION
  :: k_state == NOKEY -> assert(false)   /* "claimed key vanished" */
#else
  /* must_read: RuntimeError("claimed key vanished") → 500: a worker that held the key
     stalled past the purge of its tombstone (retention + tolerance later) */
  :: k_state == NOKEY -> code = R_NONE; respond()
#endif
  fi
}

/* service.answer_after_lost_lease: our guarded write found 0 rows (someone took the key
   over meanwhile): read the row; processing → 202 (its new owner settles it), else
   existing(record). The read is merged with the refused write (README.md, "Abstractions"). */
inline lost_lease() {
  tok = 0;
  if
  :: k_state == PROC -> code = R_PROCESSING; respond()
  :: else -> existing()
  fi
}

/* _write_ending -> service.finish -> store.complete WHERE lease_token = mine, the
   transaction, its ledger entry and outbox event: one COMMIT; 0 rows → lost_lease() */
inline finish() {
  if
  :: COMPLETE_GUARD(tok) ->
       stale_check(tok);
       k_state = DONE; k_live = 0; t_count++; t_status = ans;
       code = ans; respond()
  :: else -> lost_lease()
  fi
}

/* acquire.settle_in_doubt -> _write_ending: store.complete (the same guarded UPDATE), the
   declined / acquirer_timeout transaction and advice.queue (the 0420): ONE COMMIT */
inline settle_in_doubt() {
  if
  :: COMPLETE_GUARD(tok) ->
       stale_check(tok);
       k_state = DONE; k_live = 0; t_count++; t_status = ST_DECLINED; adv = 1;
       code = ST_DECLINED; respond()
  :: else -> lost_lease()
  fi
}

/* acquire._release -> store.forget: DELETE … WHERE state = 'processing' AND lease_token =
   mine; 503 (nothing was processed); 0 rows → lost_lease() */
inline release() {
  if
  :: OWNED(tok) ->
       stale_check(tok);
       k_state = NOKEY; k_tok = 0; k_live = 0; claim_old = 0;
       code = R_NONE; respond()          /* 503: in doubt for the SDK, like a lost answer */
  :: else -> lost_lease()
  fi
}

/* acquire._hand_over (an offline sale's 0220 unanswered) -> store.release: UPDATE … SET
   lease_until = now WHERE state = 'processing' AND lease_token = mine; then 202: the
   completer repeats the advice */
inline hand_over() {
  if
  :: OWNED(tok) -> stale_check(tok); k_live = 0
  :: else
  fi;
  code = R_PROCESSING; respond()
}

/* the in-doubt ending: a sale settles declined + advice; an offline sale is handed over */
inline in_doubt() {
  if
  :: KADV -> hand_over()
  :: else -> settle_in_doubt()
  fi
}

/* POST /v1/transactions → service.create: its first transaction (store.get, then the
   claim or the expired fence), or existing(record) */
inline create_request() {
    if
#ifdef RETENTION
    /* service._too_late / _clock_skew, on the server's clock (contract §3.5): a timestamp
       older than the retention is too late (fenced as expired, below; an advice: 422
       advice_too_old, nothing stored); one further ahead than the tolerance is refused,
       422 clock_skew, nothing stored */
    :: k_state == NOKEY && t_stamp + RET < clk && kind == ADVICE ->
         code = R_TOO_OLD; respond()
    :: k_state == NOKEY && t_stamp + RET < clk && kind != ADVICE ->
         k_state = EXPD; TOMB_AT; code = R_FENCED; respond()
#ifndef MUTANT_NO_FUTURE_REFUSAL
    :: k_state == NOKEY && t_stamp + RET >= clk && t_stamp > clk + TOL ->
         code = R_REJECTED; respond()
    :: k_state == NOKEY && t_stamp + RET >= clk && t_stamp <= clk + TOL ->
#else
    :: k_state == NOKEY && t_stamp + RET >= clk ->
#endif
#else
    :: k_state == NOKEY ->           /* store.get found no row */
#endif
         if
#ifndef NO_EXPIRY
         :: kind != ADVICE ->         /* an advice is exempt from expires_at */
              /* _too_late(body, key, now): now >= expires_at, or captured_at / the UUIDv7
                 key older than the tombstone window. The server's clock is not the
                 terminal's (expires_at comes from the SDK's clock), so the model lets any
                 create that finds no row be too late, whatever t_deadline says; runs where
                 it never is (send_expires_at=False) are a subset (README.md, "Abstractions") */
#ifdef MUTANT_CHECK_THEN_INSERT
              nxt = N_FENCE          /* the blind insert comes in a later statement */
#else
              /* _fence_expired → store.fence(state = 'expired'):
                 INSERT … ON CONFLICT DO NOTHING */
              k_state = EXPD; TOMB_AT; code = R_FENCED; respond()
#endif
#endif
         :: true ->                   /* not too late */
              /* _claim_and_drive → _claim → store.claim: INSERT (state = 'processing',
                 lease_token = 1, lease_until = now + acquirer timeout + lease)
                 ON CONFLICT DO NOTHING; COMMIT */
              k_state = PROC; k_tok = 1; k_live = 1; tok = 1; claim_old = 0;
#ifdef OFFLINE
              k_adv = (kind == ADVICE);
#endif
              nxt = N_SEND
         fi
    :: else -> existing()            /* the row is there: existing(record) */
    fi
}

/* POST /v1/transactions/{id}/abort → resolution.abort: service.read, then store.fence
   (INSERT state = 'aborted' ON CONFLICT DO NOTHING, + outbox), or _abort_existing */
inline abort_request() {
    if
    :: k_state == NOKEY ->
#ifdef MUTANT_CHECK_THEN_INSERT
         nxt = N_FENCE; top = 1      /* the blind insert comes in a later statement */
#else
         /* store.fence(state = 'aborted'): INSERT … ON CONFLICT DO NOTHING; + outbox */
         k_state = ABRT; TOMB_AT; code = R_FENCED; respond()
#endif
    :: k_state == DONE -> code = t_status; respond()      /* _abort_existing */
    :: k_state == ABRT || k_state == EXPD -> code = R_FENCED; respond()
    /* _abort_may_take_over: never for an offline sale (a client's abort); else an expired
       lease, or a claim older than the answer time (the key is the server's own by then:
       answered 202, still at the acquirer, or abandoned) -- else 409 */
    :: k_state == PROC && KADV -> code = R_BUSY; respond()
    :: k_state == PROC && !KADV && (!k_live || claim_old) -> take_over(); nxt = N_ABORT
    :: k_state == PROC && !KADV && k_live && !claim_old ->
         claim_old = 1; take_over(); nxt = N_ABORT   /* the answer time has passed now */
    :: k_state == PROC && !KADV && k_live && !claim_old -> code = R_BUSY; respond()
    fi
}

active [3] proctype Server()
{
  mtype kind = CREATE;
  byte ep, code, tok, ans, nxt;
  bool top, answered;

end_idle:
  do
  :: {
       if
       :: !completer ->
            /* the idle worker with the lowest id takes the request (the workers are
               interchangeable: this only prunes mirror-image states); its first SQL
               statement runs in the same step */
end_request:
            atomic {
              (me == 0 || busy[0]) && req?[kind,ep] -> req?kind,ep; busy[me] = 1;
              if
              :: kind == CREATE || kind == ADVICE -> create_request(); kind = CREATE
              :: kind == ABORT  -> kind = CREATE; abort_request()
              fi
            }
       :: completer ->
            /* Completer.admit: due_per_merchant (state = 'processing' AND lease_until <
               now), then _recover → recovery.recover: take_over */
end_scan:
            atomic {
              k_state == PROC && !k_live -> busy[me] = 1; answered = 1;
              recover()
            }
       fi;
       if
       :: !busy[me] -> goto done
       :: nxt == N_SEND -> goto send
       :: nxt == N_SETTLE -> goto settle
       :: nxt == N_ABORT -> goto abort_fence_owned
       :: nxt == N_FENCE -> goto blind_fence
       fi;

/* ---- recovery.recover: settle in doubt (the completer, or a create's retry) ---------- */
settle:
       atomic { settle_in_doubt() }
       goto done;

/* ---- acquire.authorize_and_finish: ONE 0200, no transaction open ------------------- */
send:
       /* link.authorize (an offline sale: link.advise_sale, a 0220, or 0221 repeated):
          written to a connection, or no connection at all (NeverSent). The acquirer's
          decision is recorded in the ghost when the 0200 is written (README.md,
          "Abstractions"): it arrives and is approved -- a repeated RRN gets the original
          answer, an RRN whose advice came first is declined (REVERSED_FIRST) -- or it is
          lost on its way. Only 0200s count for a (a 0220 is not one). */
       atomic {
         nxt = 0; ans = AU_NONE;
         if
#ifndef ACQUIRER_DOWN
         :: true ->                       /* written; it arrives */
              if
              :: !KADV -> a_sent++
              :: else
              fi;
              if
              :: a_auth == AU_NONE && !adv -> a_auth = AU_APPR
              :: a_auth == AU_NONE && adv -> a_auth = AU_DECL
              :: else
              fi;
              ans = a_auth
         :: acq_faults > 0 ->             /* written; lost on its way */
              acq_faults--;
              if
              :: !KADV -> a_sent++
              :: else
              fi
#else
         :: !KADV -> a_sent++             /* tok_issuer_down: recorded, never answered */
         :: KADV
#endif
         :: acq_faults > 0 -> acq_faults--; nxt = N_NEVER   /* NeverSent: nothing left */
         fi
       }
       /* drive: IDEMPAY_ANSWER_WITHIN passes at any moment → 202, the work goes on; then
          the work's ending, each one commit with the event that decides it (the event has
          no durable effect of its own, so a crash just before the commit is a crash just
          before the event) */
       do
       :: atomic { !answered -> code = R_PROCESSING; reply() }   /* 202 */
       /* NeverSent: before the 202, drop the claim (answer.releasing: the create waits for
          the 503, never answers 202); after it, settle in doubt -- the 202 promised the key
          ends terminal on its own. An offline sale is handed over. */
       :: atomic { nxt == N_NEVER && !answered && !KADV ->
                   release() }; break
       :: atomic { nxt == N_NEVER && (answered || KADV) -> nxt = 0; in_doubt() }; break
       /* the 0210 (0230) → finish */
       :: atomic { nxt == 0 && ans != AU_NONE -> finish() }; break
       /* no answer within IDEMPAY_ACQUIRER_TIMEOUT: nothing will come */
       :: atomic { nxt == 0 && ans == AU_NONE ->
#ifdef MUTANT_RELEASE_IN_DOUBT
                   if
                   :: !answered && !KADV -> release()   /* taken for a 0200 never sent */
                   :: else -> in_doubt()
                   fi
#else
                   in_doubt()
#endif
                 }; break
       /* the answer lost or late, or the connection broken after the write */
       :: atomic { nxt == 0 && ans != AU_NONE && acq_faults > 0 ->
                   acq_faults--; ans = AU_NONE;
#ifdef MUTANT_RELEASE_IN_DOUBT
                   if
                   :: !answered && !KADV -> release()
                   :: else -> in_doubt()
                   fi
#else
                   in_doubt()
#endif
                 }; break
       od;
       goto done;

/* ---- POST /v1/transactions/{id}/abort: resolution.abort -------------------------- */
abort_fence_owned:                        /* _abort_existing, after its take-over */
       /* recovery.fence: store.fence_owned (UPDATE … SET state = 'aborted' WHERE state =
          'processing' AND lease_token = mine) and, only if it won, advice.queue and the
          outbox event: ONE COMMIT */
       atomic {
         if
         :: OWNED(tok) ->
              stale_check(tok); k_state = ABRT; k_live = 0; TOMB_AT;
#ifndef MUTANT_FENCE_WITHOUT_ADVICE
              adv = 1
#else
              skip
#endif
         :: else
         fi;
         tok = 0; nxt = 0
       }
       atomic {                           /* again = service.read, _abort_existing(again) */
         if
         :: k_state == DONE -> code = t_status
         :: k_state == ABRT || k_state == EXPD -> code = R_FENCED
         :: k_state == PROC -> code = R_BUSY
#ifdef RETENTION
         :: k_state == NOKEY -> code = R_NONE   /* purged meanwhile (a stalled abort): 500 */
#endif
         fi;
         respond()
       }
       goto done;

blind_fence:
       /* MUTANT_CHECK_THEN_INSERT: the insert that follows the check, as a blind write */
       atomic {
         if
         :: top -> k_state = ABRT         /* abort */
         :: else -> k_state = EXPD        /* _fence_expired */
         fi;
         k_live = 0; TOMB_AT; code = R_FENCED; respond()
       }
done:
       skip
     } unless {
       crash[me] ->
       d_step {                           /* the process dies: its open transaction rolls back */
         if
         :: busy[me] && !completer && !answered -> inuse[ep]--   /* its client sees a reset */
         :: else
         fi;
         if
         :: tok != 0 && OWNED(tok) -> k_live = 0   /* its lease runs out (README.md) */
         :: else
         fi;
         crash[me] = 0; busy[me] = 0; kind = CREATE; ep = 0; code = 0; tok = 0; ans = 0;
         nxt = 0; top = 0; answered = 0
       }
     }
  od
}

/* ======================================================================== the terminal (SDK) */
/* Journal writes. Under TWO_DRIVERS each one is Journal.transition guarded by the journal
   lease (the fix) or only by the journal's own state machine (the mutant); a write that
   fails sets jlost, and jlost_then() decides what the driver reports. Elsewhere they are
   plain assignments. */
#ifdef TWO_DRIVERS
inline jwrite(s) {
  if
  :: J_MINE(1) -> j_state = s
  :: else -> jlost = 1
  fi
}
inline jfinal(s, r) {
  if
  :: J_MINE(1) -> j_state = s; j_out = r; reported = r
  :: else -> jlost = 1
  fi;
  finished = 1
}
/* The terminal's write was refused. The fix: re-read the entry; resolved by the other
   driver → return that outcome; else leave it to its driver (PaymentInDoubt, the entry
   stays). The mutant: Journal.transition raised InvalidTransition out of a final state,
   an IdempayError: the app shows "failed". */
inline jlost_then() {
  if
  :: jlost ->
#ifdef MUTANT_PER_INSTANCE_DRIVER
       reported = REP_FAILED;
#else
       if
       :: j_state == J_RESOLVED || j_state == J_ABORTED -> reported = j_out
       :: else -> reported = R_NONE
       fi;
#endif
       finished = 1; sent = 0; code = R_NONE
  :: else
  fi
}
#else
inline jwrite(s) { j_state = s }
inline jfinal(s, r) { j_state = s; reported = r; finished = 1 }
inline jlost_then() { skip }
#endif

#ifdef OFFLINE
/* _forward.store_offline: accepted offline (STORED, then the SDK returns approved-offline;
   the next call -- or recover() -- forwards it), or refused by a limit of the policy:
   OfflineLimitError, a PaymentAborted(not_sent) */
inline store_offline() {
  if
  :: j_state = J_STORED; reported = REP_OFFLINE; sold_offline = 1; fwd = 1; phase = CREATE
  :: jfinal(J_ABORTED, REP_ABORTED)
  fi
}

/* _forward._advise for the answer in `code`: the server's transaction ends the entry
   RESOLVED, a fence or advice_too_old ends it REPORTED (never processed: the merchant
   reconciles); a 404 resends the advice, same key; the link still down leaves it stored;
   anything else (202, 409, no reply, a rejection) is looked up -- never aborted. The
   entry stays STORED throughout. */
inline forward_action() {
  if
  :: code == R_APPROVED || code == R_DECLINED ->
       j_state = J_RESOLVED; fwd_out = code; finished = 1
  :: code == R_FENCED || code == R_TOO_OLD ->
       j_state = J_REPORTED; fwd_out = code; finished = 1
  :: code == R_NOTFOUND -> phase = CREATE
  :: code == R_NONE && !sent && phase == CREATE    /* still offline: try again later */
  :: else ->
       if
       :: code == R_PROCESSING || code == R_BUSY -> w = W_PROC
       :: else
       fi;
       phase = LOOKUP
  fi;
  code = R_NONE; sent = 0
}
#endif

/* _actions.next_action for the answer in `code`, and the journal write that follows it
   (a crash between the two is a crash while waiting: only the journal survives either way);
   -DOFFLINE: a stored payment's forward answers go to forward_action() */
inline next_action() {
#ifdef OFFLINE
  if
  :: fwd -> forward_action()
  :: else -> sale_action()
  fi
#else
  sale_action()
#endif
}

inline sale_action() {
  if
  :: code == R_REJECTED ->
       /* a create attempt refused before anything was processed: definitive
          only if no earlier attempt may have reached the server; else it proves nothing
          about the earlier copy, so resolve the key (lookup, abort at the deadline) like
          after a lost answer (contract §4). The mutant: the rejection is the outcome. */
#ifndef MUTANT_REJECT_IS_OUTCOME
       if
       :: maybe_sent -> code = R_NONE
       :: else
       fi
#else
       skip
#endif
  :: else
  fi;
  if
  :: phase == CREATE && sent && code != R_REJECTED -> maybe_sent = 1
  :: else
  fi;
  if
  :: code == R_REJECTED ->                        /* Reject: record(RESOLVED, error), raise */
       jfinal(J_RESOLVED, REP_REJECTED)
  :: code == R_APPROVED || code == R_DECLINED ->  /* Finish: record(RESOLVED) */
       jfinal(J_RESOLVED, code)
  :: code == R_FENCED ->                          /* Fence: record(ABORTED), PaymentAborted */
       jfinal(J_ABORTED, REP_ABORTED)
  :: code == R_NOTFOUND ->
#ifdef MUTANT_404_GIVES_UP
       jfinal(J_ABORTED, REP_ABORTED)
#else
       if
#ifndef MUTANT_RECOVER_RESENDS
       :: booted ->                               /* recover(): the server does not know
                                                     the key; fence it, never sell */
            phase = ABORT; to_abort = 1;          /* the abort goes out next */
            if
            :: j_state != J_IN_DOUBT -> jwrite(J_IN_DOUBT)
            :: else
            fi
#endif
       :: else -> phase = CREATE                  /* pay(): resend, same request, same key */
       fi
#endif
  :: code == R_NONE && !sent && phase == CREATE -> /* never left: create again */
#ifdef OFFLINE
       if                                         /* nothing may have reached the server:
                                                     a sale may be accepted offline */
       :: !booted && !maybe_sent -> store_offline()
       :: true                                    /* or create again (connect_attempts) */
       fi
#else
       skip
#endif
#ifdef MUTANT_OFFLINE_AFTER_SEND
  :: code == R_NONE && sent && phase == CREATE && !booted ->
       store_offline()                            /* a lost answer taken for a dead link */
#endif
  :: else ->                                      /* 202, 409, no reply: in doubt */
       if
       :: j_state != J_IN_DOUBT -> jwrite(J_IN_DOUBT)
       :: else
       fi;
       if
       :: code == R_PROCESSING || (code == R_BUSY && phase != ABORT) -> w = W_PROC
       :: code == R_BUSY && phase == ABORT -> w = W_LIVE
       :: else                                    /* no reply: ask again now */
       fi;
       if
       :: phase == CREATE -> phase = LOOKUP
       :: else                                    /* lookup again / abort again */
       fi
  fi;
  code = R_NONE; sent = 0;
  jlost_then()
}

active proctype Terminal()
{
  mtype phase = CREATE;
  byte code, e, w;
  bool maybe_sent, free_pass, sent, finished, jlost, to_abort;
  bool fwd;                               /* -DOFFLINE: forwarding a stored payment */
  bool booted;                            /* in recover(): after a reboot, or after
                                             PaymentInDoubt (the entry waits for it) */

  atomic {
    configure();
#ifdef RETENTION
    if                                    /* the terminal's clock, at Journal.begin */
    :: t_stamp = 0                        /* in step with the server's */
    :: t_stamp = TOL                      /* ahead, by up to the tolerance */
#ifdef SKEW_BEYOND
    :: t_stamp = TOL + 1                  /* ahead, beyond the tolerance */
#endif
    fi;
#endif
#ifdef TWO_DRIVERS
    j_owner = 1;                          /* the lease, taken with the entry */
#endif
    j_state = J_PENDING                   /* journal.begin: committed before the first send */
  }
  do
  :: {
       if
       :: !booted                         /* pay(): drive(start = CREATE) */
       :: booted ->                       /* recover(): re-read the entry; settle, never sell */
            d_step {
#ifdef TWO_DRIVERS
              if
              :: j_state == J_RESOLVED || j_state == J_ABORTED ->
                   finished = 1           /* resolved meanwhile: not listed by unresolved() */
#ifndef MUTANT_PER_INSTANCE_DRIVER
              :: j_state != J_RESOLVED && j_state != J_ABORTED && j_owner != 0 ->
                   finished = 1           /* another live driver holds its lease: leave it */
              :: j_state != J_RESOLVED && j_state != J_ABORTED && j_owner == 0 ->
                   j_owner = 1
#else
              :: else
#endif
              fi;
#endif
              free_pass = 1; maybe_sent = (j_state != J_PENDING);
              if
#if defined(OFFLINE) && !defined(MUTANT_RECOVER_FENCES_STORED)
              :: j_state == J_STORED ->   /* sold offline: forward it, never fence it */
                   phase = CREATE; fwd = 1
#endif
#ifndef MUTANT_RECOVER_RESENDS
              :: j_state == J_PENDING ->  /* never sent: fence it with abort, never send */
                   phase = ABORT
#endif
              :: else -> phase = LOOKUP   /* drive(start = LOOKUP, lookup_first) */
#if defined(OFFLINE) && !defined(MUTANT_RECOVER_FENCES_STORED)
                   ; assert(j_state != J_STORED)
#endif
              fi
            }
            if
            :: finished -> goto end_done
            :: else
            fi
       fi;
loop:
       /* drive(): the deadline may have passed by now; then _fence (record IN_DOUBT, abort).
          Then record(SENT) before every create, and one request on a fresh connection. */
       atomic {
         if
         :: !t_deadline && phase != ABORT -> t_deadline = 1
         :: true
         fi;
         if
         :: t_deadline && !free_pass && phase != ABORT && !fwd ->
              phase = ABORT;
              if
              :: j_state != J_IN_DOUBT -> jwrite(J_IN_DOUBT)
              :: else
              fi
         :: else
         fi;
         free_pass = 0;
         if
         :: phase == CREATE && !fwd -> jwrite(J_SENT)
         :: else                          /* a forward: record(STORED, attempts) */
         fi;
         if
         :: jlost -> jlost_then()         /* the write was refused: send nothing */
         :: !jlost && phase == LOOKUP ->
              /* GET /v1/transactions/{id} → resolution.lookup: one read, no effects, so the
                 model evaluates it when it is sent (README.md, "Abstractions") */
              if
              :: net_faults > 0 -> net_faults--      /* no reply: lost either way */
              :: true ->
                   sent = 1;
                   if
                   :: k_state == NOKEY -> code = R_NOTFOUND
                   :: k_state == DONE -> code = t_status
                   :: k_state == PROC -> code = R_PROCESSING
                   :: k_state == ABRT || k_state == EXPD -> code = R_FENCED
                   fi
              fi;
              next_action()
         :: !jlost && phase != LOOKUP ->
              e = 0;                      /* the lowest connection id with nothing in flight */
              do
              :: e < NEP && inuse[e] > 0 -> e++
              :: else -> break
              od;
              assert(e < NEP);
              if
              :: net_faults > 0 -> net_faults--; e = 0; next_action()  /* ConnectError */
              :: phase == CREATE && rejects > 0 ->   /* refused before processing: 408 (body
                                                        too slow), 401, 413, a proxy's 4xx */
                   rejects--; e = 0; sent = 1; code = R_REJECTED; next_action()
              :: nfull(req) -> t_cur = e; e = 0;
#ifdef OFFLINE
                   if
                   :: phase == ABORT && sold_offline -> stored_aborts++
                   :: else
                   fi;
                   if
                   :: fwd && phase == CREATE -> req!ADVICE,t_cur   /* entry_mode offline */
                   :: else -> req!phase,t_cur
                   fi;
#else
                   req!phase,t_cur;
#endif
                   inuse[t_cur]++; sent = 1
              fi
         fi
       }
       if
       :: sent && phase != LOOKUP ->
            do
            :: atomic { mbox != R_NONE -> code = mbox; mbox = R_NONE; t_cur = NEP;
                        next_action() }; break
            :: atomic { inuse[t_cur] == 0 && mbox == R_NONE ->  /* lost: timeout / reset */
                        t_cur = NEP; next_action() }; break
            :: atomic { net_faults > 0 ->                      /* timeout, still on its way */
                        net_faults--; t_cur = NEP; mbox = R_NONE; next_action() }; break
            od
       :: else
       fi;
       if
       :: finished -> goto end_done
       :: to_abort -> to_abort = 0        /* recover() has not sent its abort yet */
       :: !finished && !to_abort && phase == ABORT ->
                                          /* 409 / no reply: retry within abort_grace_s */
            if
            :: true
            :: !maybe_sent ->             /* grace over, never sent: PaymentAborted(not_sent) */
                 d_step { jfinal(J_ABORTED, REP_ABORTED); jlost_then() }
                 goto end_done
            :: maybe_sent ->              /* grace over: PaymentInDoubt; recover() later */
#ifdef MUTANT_NO_RECOVER
                 goto end_done            /* nobody ever calls recover() */
#endif
                 d_step { phase = LOOKUP; free_pass = 1; booted = 1 }
            fi
       :: else
       fi;
       /* Retry-After / backoff: asking again before anything changed would get the same
          answer, so the terminal asks again once something has */
       if
       :: w == W_PROC ->
            if
            :: atomic { k_state != PROC || t_deadline -> w = W_NONE }
            :: atomic { !t_deadline -> t_deadline = 1; w = W_NONE }
            fi
       :: w == W_LIVE ->
            if
            :: atomic { k_state != PROC || !k_live || claim_old -> w = W_NONE }
            :: atomic { !claim_old -> claim_old = 1; w = W_NONE }   /* the claim ages */
            fi
       :: w == W_NONE
       fi;
       goto loop
     } unless {
       t_crash ->
       d_step {                           /* the terminal dies; only the journal survives */
         if                               /* the cashier saw it die and runs the sale again */
         :: j_state == J_PENDING -> unsent_at_boot = 1
         :: else
         fi;
#ifdef TWO_DRIVERS
         if                               /* a dead driver's journal lease runs out */
         :: j_owner == 1 -> j_owner = 0
         :: else
         fi;
#endif
         booted = 1;                      /* the next boot runs recover() */
         t_crash = 0; t_cur = NEP; mbox = R_NONE; phase = CREATE; code = R_NONE; e = 0;
         maybe_sent = 0; free_pass = 0; sent = 0; w = W_NONE; jlost = 0; to_abort = 0;
         fwd = 0
       }
     }
  od;
end_done:
  skip
}

#ifdef TWO_DRIVERS
/* A second Client on the same journal (another thread or process) runs recover() once:
   Journal.unresolved() lists the entry, recover_entry re-reads it and takes its lease (the
   fix), looks the key up and records a definitive answer. Its abort (after a 404) is not
   modelled: it leaves the entry in doubt instead (README.md, "What the model does not
   cover"). */
active proctype Driver2()
{
  byte c;
end_d2:                                   /* it may never find the entry unresolved */
  atomic { j_state == J_PENDING || j_state == J_SENT || j_state == J_IN_DOUBT -> skip }
#ifndef MUTANT_PER_INSTANCE_DRIVER
  atomic {                                /* re-read the entry and take its lease */
    if
    :: j_state == J_RESOLVED || j_state == J_ABORTED ->
         reported2 = j_out; goto d2_end   /* resolved meanwhile: that outcome */
    :: j_state != J_RESOLVED && j_state != J_ABORTED && j_owner != 0 ->
         goto d2_end                      /* another live driver holds it: leave it */
    :: j_state != J_RESOLVED && j_state != J_ABORTED && j_owner == 0 ->
         j_owner = 2
    fi
  }
#endif
  atomic {                                /* GET /v1/transactions/{id} */
    if
    :: k_state == NOKEY -> c = R_NOTFOUND
    :: k_state == DONE -> c = t_status
    :: k_state == PROC -> c = R_PROCESSING
    :: k_state == ABRT || k_state == EXPD -> c = R_FENCED
    fi
  }
  atomic {                                /* record the definitive answer */
    if
    :: c == R_APPROVED || c == R_DECLINED || c == R_FENCED ->
         if
         :: c == R_FENCED -> c = REP_ABORTED
         :: else
         fi;
         if
         :: J_MINE(2) ->
              if
              :: c == REP_ABORTED -> j_state = J_ABORTED
              :: else -> j_state = J_RESOLVED
              fi;
              j_out = c; reported2 = c
         :: else -> reported2 = REP_FAILED   /* InvalidTransition */
         fi
    :: else                               /* 202 / 404: in doubt, left for later */
    fi;
    if
    :: j_owner == 2 -> j_owner = 0
    :: else
    fi;
    c = 0
  }
d2_end:
  skip
}
#endif

/* ======================================================================== the faulty world */
/* Faults, within the budgets above. Under FAIR (the liveness run) the world may also stop
   misbehaving at any moment; weak fairness then makes it stop eventually. */
active proctype World()
{
  mtype k;
  byte e;
end_world:
  do
  /* the network */
  :: atomic { net_faults > 0 && nempty(req) -> req?k,e; inuse[e]--; net_faults--;
              k = CREATE; e = 0 }                                       /* drop a request */
  :: atomic { net_faults > 0 && mbox != R_NONE -> mbox = R_NONE; net_faults-- }  /* drop a response */
  :: atomic { net_faults > 0 && nempty(req) && nfull(req) ->          /* duplicate */
              req?<k,e>; req!k,e; inuse[e]++; net_faults--; k = CREATE; e = 0 }
  :: atomic { net_faults > 0 && len(req) > 1 ->                       /* reorder */
              req?k,e; req!k,e; net_faults--; k = CREATE; e = 0 }
  /* crashes: the actor dies before its next step */
  :: atomic { crashes > 0 && busy[0] && !crash[0] -> crash[0] = 1; crashes-- }
  :: atomic { crashes > 0 && busy[1] && !crash[1] -> crash[1] = 1; crashes-- }
  :: atomic { crashes > 0 && busy[2] && !crash[2] -> crash[2] = 1; crashes-- }
  :: atomic { t_crashes > 0 && !t_crash &&
              (j_state == J_PENDING || j_state == J_SENT || j_state == J_IN_DOUBT ||
               j_state == J_STORED) ->
              t_crash = 1; t_crashes-- }
  /* the lease holder stalls past lease_until */
  :: atomic { pauses > 0 && k_state == PROC && k_live -> k_live = 0; pauses-- }
#ifdef TWO_DRIVERS
  /* the terminal stalls past its journal lease (it does not know) */
  :: atomic { j_stalls > 0 && j_owner == 1 -> j_owner = 0; j_stalls-- }
#endif
#ifdef RETENTION
  /* time passes on the server's clock */
  :: atomic { clk < CMAX -> clk++ }
  /* retention.purge: DELETE the tombstone once updated_at < now - KEEP */
  :: atomic { (k_state == ABRT || k_state == EXPD) && clk > k_tomb + KEEP ->
              k_state = NOKEY; k_tok = 0; k_live = 0; claim_old = 0; k_tomb = 0;
              purged = 1 }
#endif
#ifdef FAIR
  :: atomic { net_faults > 0 || crashes > 0 || t_crashes > 0 || pauses > 0 || rejects > 0 ||
              acq_faults > 0 ->
              net_faults = 0; crashes = 0; t_crashes = 0; pauses = 0; rejects = 0;
              acq_faults = 0 }
                                                                    /* all is well now */
#endif
  od
}

#ifdef FAIR
/* Time goes on when nothing else can move: a run that stops in a state where the payment
   is not settled is a violation of d (SPIN's weak fairness does not stutter-extend runs
   that stop, so this process does). */
active proctype Time()
{
  do
  :: timeout                              /* nothing else can move */
  od
}
#endif

/* ======================================================================== properties */
#define P_A (a_sent <= 1)
#define P_B (!(t_count > 0 && (k_state == ABRT || k_state == EXPD)))
/* what a driver reported (returned or raised) agrees with the ledger, now and later */
#define REPORT_OK(r) \
             ((r) == R_NONE || (r) == REP_OFFLINE || \
              (((r) == REP_ABORTED || (r) == REP_REJECTED) && t_count == 0) || \
              (((r) == R_APPROVED || (r) == R_DECLINED) && t_count == 1 && t_status == (r)))
#define P_C (t_count <= 1 && REPORT_OK(reported))
#define P_E (stale_commits == 0)
/* f: once the key is settled (or gone), the acquirer's approval that no queued reversal
   advice undoes stands iff the key has an approved transaction */
#define P_F (k_state == PROC || \
             ((a_auth == AU_APPR && !adv) == (k_state == DONE && t_status == ST_APPROVED)))
/* g: a payment the terminal reported rejected (failed) was never processed
   and is not being processed (the journal entry it ended says the same) */
#define P_G (!(reported == REP_REJECTED && (t_count > 0 || k_state == PROC)))
/* h: recover() never sells -- a payment whose terminal died before sending it
   (the cashier ran the sale again) is never charged */
#define P_H (!(unsent_at_boot && t_count > 0))
/* i: a fenced key is never processed later, even after its tombstone's purge */
#ifdef RETENTION
#define P_I (!(purged && (k_state == PROC || k_state == DONE)))
#else
#define P_I 1
#endif
/* j: every driver of the key -- the terminal and a second Client on the same
   journal -- reports what the ledger says; none reports a failure */
#ifdef TWO_DRIVERS
#define P_J (REPORT_OK(reported) && REPORT_OK(reported2))
#else
#define P_J 1
#endif
/* k: store and forward stays exactly once -- a payment sold offline is never
   aborted by its terminal nor fenced as expired (an advice is exempt from expires_at), and
   its forward records what the ledger says: RESOLVED with the one transaction, REPORTED
   with none (t_count <= 1 is c's) */
#ifdef OFFLINE
#define P_K (stored_aborts == 0 && !(sold_offline && k_state == EXPD) && \
             !(j_state == J_REPORTED && t_count > 0) && \
             !(sold_offline && j_state == J_RESOLVED && \
               (t_count != 1 || t_status != fwd_out)))
#else
#define P_K 1
#endif
#define SETTLED ((j_state == J_RESOLVED || j_state == J_ABORTED || j_state == J_REPORTED) && \
                 k_state != PROC)

/* The safety properties as one monitor: it blocks until an invariant breaks, then the
   failing assertion names it. One search checks them all (scripts/verify.sh). A mutant run
   checks only the property its bug is meant to break: -DCHK_A=0 etc. switch the others off,
   so that its counterexample is a violation of that property and of no other. */
#ifndef CHK_A
#define CHK_A 1
#endif
#ifndef CHK_B
#define CHK_B 1
#endif
#ifndef CHK_C
#define CHK_C 1
#endif
#ifndef CHK_E
#define CHK_E 1
#endif
#ifndef CHK_F
#define CHK_F 1
#endif
#ifndef CHK_G
#define CHK_G 1
#endif
#ifndef CHK_H
#define CHK_H 1
#endif
#ifndef CHK_I
#define CHK_I 1
#endif
#ifndef CHK_J
#define CHK_J 1
#endif
#ifndef CHK_K
#define CHK_K 1
#endif
#define Q_A (!CHK_A || P_A)
#define Q_B (!CHK_B || P_B)
#define Q_C (!CHK_C || P_C)
#define Q_E (!CHK_E || P_E)
#define Q_F (!CHK_F || P_F)
#define Q_G (!CHK_G || P_G)
#define Q_H (!CHK_H || P_H)
#define Q_I (!CHK_I || P_I)
#define Q_J (!CHK_J || P_J)
#define Q_K (!CHK_K || P_K)
#ifdef MONITOR
active proctype Monitor()
{
end_monitor:
  atomic {
    !(Q_A && Q_B && Q_C && Q_E && Q_F && Q_G && Q_H && Q_I && Q_J && Q_K) ->
    assert(Q_A); assert(Q_B); assert(Q_C); assert(Q_E); assert(Q_F);
    assert(Q_G); assert(Q_H); assert(Q_I); assert(Q_J); assert(Q_K)
  }
}
#endif

ltl a { [] P_A }
ltl b { [] P_B }
ltl c { [] P_C }
ltl d { <> [] SETTLED }
ltl e { [] P_E }
ltl f { [] P_F }
ltl g { [] P_G }
ltl h { [] P_H }
ltl i { [] P_I }
ltl j { [] P_J }
ltl k { [] P_K }
