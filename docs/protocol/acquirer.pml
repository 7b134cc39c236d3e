/*
 * acquirer.pml -- the create across the acquirer boundary (contract §2.9, §3.3, §3.8), as
 * SPIN sees it.
 *
 * One or two idempotency keys (NK). idempay's side: a create worker per key (claim, ONE
 * 0200, finish or settle in doubt), the completer (take-over of an expired lease, settle in
 * doubt, never a second 0200), an abort per key (-DABORTS: fence + advice), POST /reversal
 * per key (-DREVERSAL: reversed + advice, then a 0400) and the advice worker (0420/0421
 * until a 0430). The acquirer host is a process of its own behind a lossy network: every
 * message may be lost, delivered late (after its sender gave up, after the advice that
 * undoes it) and in any order; the advice traffic may be duplicated. Any server actor may
 * die between two of its steps (its open transaction rolls back, its lease runs out); a
 * lease holder may stall past its lease. The acquirer's store is durable: its own crash is
 * a loss of the messages it had not answered yet, which the lossy network already covers.
 *
 * Each committed transaction is one atomic step; a crash falls between two steps.
 * README.md ("The acquirer boundary") maps every step to its code.
 *
 * Properties (scripts/verify.sh checks each one):
 *   l  §3.8 (a): the acquirer receives at most one 0200 per key
 *   m  §3.8 (b): for every key whose settlement is done and whose advice is acknowledged
 *      (the queue has drained for it), the acquirer's approval net of reversals stands
 *      iff idempay holds an approved (unreversed) transaction for the key
 *   n  liveness: every key leaves `processing` and every advice is acknowledged, once the
 *      faults are spent (LTL, acceptance cycles)
 *
 * Mutants:
 *   -DMUTANT_RESEND_0200        an unanswered 0200 is sent again (the old re-drive) -> l
 *   -DMUTANT_SETTLE_THEN_QUEUE  the in-doubt settlement (and the abort's fence) commits,
 *                               then the advice is queued in a second transaction -> m
 */

/* ======================================================================== bounds */
#ifndef NK
#define NK 1              /* keys (1 or 2) */
#endif
#ifndef NET_FAULTS
#define NET_FAULTS 1      /* a message lost, an advice message duplicated, a 0200 that
                             never left (no connection: released, 503) */
#endif
#ifndef CRASHES
#define CRASHES 1         /* deaths of server actors (create worker, completer, abort,
                             reversal) between two of their steps */
#endif
#ifndef PAUSES
#define PAUSES 1          /* a live lease holder stalls until its lease has run out */
#endif
#define MAXTOK 8          /* lease tokens: asserted, never reached */
#define MAXQ   2          /* copies of one message on the wire */

/* ======================================================================== values */
/* idempotency_key.state, with the transaction's status folded in */
#define NOKEY 0
#define PROC  1
#define APPR  2           /* completed, transaction approved */
#define DECL  3           /* completed, transaction declined (incl. acquirer_timeout) */
#define REVD  4           /* completed approved, then reversed (POST /reversal) */
#define ABRT  5           /* aborted tombstone */

/* acquirer_advice row (one per key) */
#define ADV_NONE   0
#define ADV_QUEUED 1      /* acknowledged_at IS NULL */
#define ADV_ACKED  2

/* the acquirer's authorization row, by RRN */
#define AU_NONE 0
#define AU_APPR 1
#define AU_DECL 2

#define OWNED(k, t) (k_state[k] == PROC && k_tok[k] == (t))

/* ======================================================================== idempay's database */
byte k_state[NK];         /* idempotency_key.state (+ transaction.status) */
byte k_tok[NK];           /*   lease_token */
bool k_live[NK];          /*   lease_until > now */
byte adv[NK];             /* acquirer_advice */

/* ======================================================================== the acquirer host */
byte a_recv[NK];          /* authorization.requests: 0200s that arrived for the RRN */
byte a_auth[NK];          /* authorization.state */
bool a_rev[NK];           /* authorization.reversed_at IS NOT NULL (also for an RRN first
                             seen in an advice: a 0200 arriving after it is declined) */

/* ======================================================================== the network */
/* A bag per message kind and key: a message is delivered whenever its receiver takes it,
   in any order with the others, or lost (World). */
byte n200[NK];            /* 0200 copies on the wire (idempay -> acquirer) */
byte n210[NK];            /* the 0210 on the wire: 0 none, else AU_APPR / AU_DECL */
byte n420[NK];            /* 0420/0421 advice copies */
byte n430[NK];            /* 0430 acknowledgements */
byte n400[NK];            /* 0400 reversal requests */
byte n410[NK];            /* 0410 acknowledgements */
bool waiting[NK];         /* the create worker's future for its 0200 is open */

byte net_faults = NET_FAULTS;
byte crashes = CRASHES;
byte pauses = PAUSES;

c_decl {
  int pml_budget(const char *name, int dflt) {
    const char *v = getenv(name);
    char *end;
    long n;
    if (v == NULL || *v == '\0') return dflt;
    n = strtol(v, &end, 10);
    if (*end != '\0' || n < 0 || n > 9) {
      fprintf(stderr, "acquirer.pml: bad %s=%s (0..9)\n", name, v);
      exit(2);
    }
    return (int) n;
  }
}

/* ======================================================================== shared steps */
/* kill -9 between two steps: the actor's open transaction rolls back, its lease runs out
   (README.md, "Abstractions": at once). The process ends; the completer is its restart. */
inline crash_point(k, t) {
  if
  :: atomic { crashes > 0 -> crashes--;
       if
       :: OWNED(k, t) -> k_live[k] = 0
       :: else
       fi };
     goto stop
  :: skip
  fi
}

/* acquire.settle_in_doubt -> _write_ending: store.complete guarded by the lease token,
   the declined / acquirer_timeout transaction, and advice.queue -- ONE transaction.
   recovery.fence (an abort's take-over): store.fence_owned + advice.queue + outbox -- ONE
   transaction. `to` is DECL or ABRT. */
#ifndef MUTANT_SETTLE_THEN_QUEUE
inline settle_with_advice(k, t, to) {
  atomic {
    if
    :: OWNED(k, t) -> k_state[k] = to; k_live[k] = 0; adv[k] = ADV_QUEUED
    :: else                              /* lease lost: 0 rows, nothing written */
    fi
  }
}
#else
/* the mutant: the settlement commits, then the advice in a transaction of its own */
inline settle_with_advice(k, t, to) {
  atomic {
    if
    :: OWNED(k, t) -> k_state[k] = to; k_live[k] = 0; owe = 1
    :: else
    fi
  }
  if
  :: atomic { crashes > 0 && owe -> crashes--; owe = 0 }; goto stop
  :: skip
  fi;
  atomic { if :: owe -> adv[k] = ADV_QUEUED; owe = 0 :: else fi }
}
#endif

/* ======================================================================== idempay: create */
/* service._claim_and_drive -> acquire.authorize_and_finish for key k */
proctype Create(byte k)
{
  byte tok, ans;
  bool owe, resent;

claim:
  /* _claim -> store.claim: INSERT (processing, lease_token 1) ON CONFLICT DO NOTHING; a row
     already there -> existing(): the replay, 409, 410 (a fence) -- or, with its lease
     expired, the recovery that the completer stands for */
  atomic {
    if
    :: k_state[k] == NOKEY -> k_state[k] = PROC; k_tok[k] = 1; k_live[k] = 1; tok = 1
    :: else -> goto stop
    fi
  }
  crash_point(k, tok);                   /* died between the claim and the 0200 */
send:
  /* link.authorize: the 0200 is written to a connection -- or there is none (NeverSent:
     nothing left, _release) */
  atomic {
    if
    :: n200[k] < MAXQ -> n200[k]++; waiting[k] = 1
    :: net_faults > 0 && !resent -> net_faults--; goto release
    fi
  }
  /* the 0210, or no answer within IDEMPAY_ACQUIRER_TIMEOUT / the connection broken after
     the write (at any moment: an answer on its way arrives late), or the process dies */
  if
  :: atomic { n210[k] != 0 && waiting[k] -> ans = n210[k]; n210[k] = 0; waiting[k] = 0 };
     crash_point(k, tok);                /* died between the 0210 and its finish */
     /* _write_ending -> finish: store.complete WHERE lease_token = mine, transaction,
        ledger, outbox: one COMMIT; 0 rows (taken over meanwhile) -> the winner's answer
        (answer_after_lost_lease): its settlement queued the advice that undoes ours */
     atomic {
       if
       :: OWNED(k, tok) && ans == AU_APPR -> k_state[k] = APPR; k_live[k] = 0
       :: OWNED(k, tok) && ans == AU_DECL -> k_state[k] = DECL; k_live[k] = 0
       :: else
       fi
     }
     goto stop
  :: atomic { waiting[k] -> waiting[k] = 0 }     /* in doubt */
#ifdef MUTANT_RESEND_0200
     /* the old re-drive: send the unanswered 0200 again (same RRN) and wait once more */
     if
     :: !resent -> resent = 1; goto send
     :: else
     fi;
#endif
     settle_with_advice(k, tok, DECL);
     goto stop
  :: atomic { crashes > 0 -> crashes--; waiting[k] = 0;     /* died waiting */
       if
       :: OWNED(k, tok) -> k_live[k] = 0
       :: else
       fi };
     goto stop
  fi;
release:
  /* _release -> store.forget WHERE lease_token = mine: the claim is dropped, 503 (nothing
     was processed); the terminal retries with the same key */
  atomic {
    if
    :: OWNED(k, tok) -> k_state[k] = NOKEY; k_tok[k] = 0; k_live[k] = 0; tok = 0
    :: else -> goto stop
    fi
  }
  goto claim;
stop:
  skip
}

/* ======================================================================== idempay: the completer */
/* Completer.run_once -> store.expired_leases -> recovery.recover: take_over (a compare-and-
   set on the token, merged with the read that saw the expired lease), then settle in
   doubt -- never a second 0200. Also every other taker of an expired lease (a create's
   retry in existing()); they differ only in who answers. */
active proctype Completer()
{
  byte k, tok;
  bool owe;

end_scan:
  do
  :: atomic {
       ((k_state[0] == PROC && !k_live[0])
#if NK > 1
        || (k_state[1] == PROC && !k_live[1])
#endif
       ) ->
       if
       :: k_state[0] == PROC && !k_live[0] -> k = 0
#if NK > 1
       :: k_state[1] == PROC && !k_live[1] -> k = 1
#endif
       fi;
       k_tok[k]++; k_live[k] = 1; tok = k_tok[k];
       assert(k_tok[k] < MAXTOK)
     };
     crash_point(k, tok);
     settle_with_advice(k, tok, DECL);
stop:                                     /* dead or done: the next pass (a restart) */
     atomic { k = 0; tok = 0; owe = 0 }
  od
}

/* ======================================================================== idempay: abort */
#ifdef ABORTS
/* resolution.abort: no row -> store.fence (a tombstone; nothing was sent); processing ->
   _abort_may_take_over (an expired lease, or a claim older than the answer window: the
   model lets the latter come at any moment) -> recovery.take_over -> recovery.fence;
   completed / aborted -> the truth, nothing written */
proctype Abort(byte k)
{
  byte tok;
  bool owe;

  atomic {
    if
    :: k_state[k] == NOKEY -> k_state[k] = ABRT; goto stop
    :: k_state[k] == PROC ->
         k_tok[k]++; k_live[k] = 1; tok = k_tok[k]; assert(k_tok[k] < MAXTOK)
    :: else -> goto stop
    fi
  }
  crash_point(k, tok);
  settle_with_advice(k, tok, ABRT);
stop:
  skip
}
#endif

/* ======================================================================== idempay: reversal */
#ifdef REVERSAL
/* resolution.reverse: repository.reverse + advice.queue(reversal) + outbox, ONE
   transaction; then _send_reversal: one 0400, its 0410 acknowledges the advice; no 0410
   -> the advice worker repeats it as a 0420 */
proctype Reversal(byte k)
{
  bool owe;
end_wait:
  atomic { k_state[k] == APPR -> k_state[k] = REVD; adv[k] = ADV_QUEUED }
  if
  :: atomic { crashes > 0 -> crashes-- }; goto stop
  :: skip
  fi;
  atomic { n400[k] < MAXQ -> n400[k]++ }
  if
  :: atomic { n410[k] > 0 -> n410[k]--; adv[k] = ADV_ACKED }
  :: skip                                 /* REVERSAL_WAIT_S passed */
  fi;
stop:
  skip
}
#endif

/* ======================================================================== idempay: the advice worker */
/* AdviceWorker.run_once: the due advices, each attempt owned by a compare-and-set, sent as
   0420 (0421 after) with no transaction open; a 0430 -> advice.acknowledge; else
   retry_later. A worker that dies mid-attempt leaves the row queued: due again. A 0430 is
   only ever sent for an applied advice, so taking any 0430 as the acknowledgement is
   sound for m. */
active proctype AdviceWorker()
{
  byte k;
end_idle:
  do
  :: atomic { (adv[0] == ADV_QUEUED && n420[0] == 0 && n430[0] == 0) -> n420[0]++ }
  :: atomic { n430[0] > 0 -> n430[0]--;
              if :: adv[0] == ADV_QUEUED -> adv[0] = ADV_ACKED :: else fi }
#if NK > 1
  :: atomic { (adv[1] == ADV_QUEUED && n420[1] == 0 && n430[1] == 0) -> n420[1]++ }
  :: atomic { n430[1] > 0 -> n430[1]--;
              if :: adv[1] == ADV_QUEUED -> adv[1] = ADV_ACKED :: else fi }
#endif
  od
}

/* ======================================================================== the acquirer host */
/* api/acquirer/host/book.py: the decision for a 0200 is committed before its 0210 is
   written; a repeated 0200 for an RRN gets the original answer (and is counted); a 0200
   after a reversal or advice for its RRN is declined (REVERSED_FIRST); 0400/0420/0421
   reverse once, idempotently, and are acknowledged even for an RRN never seen. */
inline acquirer_0200(k) {
  n200[k]--; a_recv[k]++;
  if
  :: a_auth[k] != AU_NONE                /* a duplicate: the original answer */
  :: a_auth[k] == AU_NONE && a_rev[k] -> a_auth[k] = AU_DECL
  :: a_auth[k] == AU_NONE && !a_rev[k] -> a_auth[k] = AU_APPR
  :: a_auth[k] == AU_NONE && !a_rev[k] -> a_auth[k] = AU_DECL   /* 05, 51 */
  fi;
  n210[k] = a_auth[k]
}

active proctype Acquirer()
{
end_idle:
  do
  :: atomic { n200[0] > 0 -> acquirer_0200(0) }
  :: atomic { n420[0] > 0 && n430[0] < MAXQ -> n420[0]--; a_rev[0] = 1; n430[0]++ }
  :: atomic { n400[0] > 0 && n410[0] < MAXQ -> n400[0]--; a_rev[0] = 1; n410[0]++ }
#if NK > 1
  :: atomic { n200[1] > 0 -> acquirer_0200(1) }
  :: atomic { n420[1] > 0 && n430[1] < MAXQ -> n420[1]--; a_rev[1] = 1; n430[1]++ }
  :: atomic { n400[1] > 0 && n410[1] < MAXQ -> n400[1]--; a_rev[1] = 1; n410[1]++ }
#endif
  od
}

/* ======================================================================== faults */
#define NET_LOSS(k) \
  :: atomic { net_faults > 0 && n200[k] > 0 -> net_faults--; n200[k]-- } \
  :: atomic { net_faults > 0 && n210[k] != 0 -> net_faults--; n210[k] = 0 } \
  :: atomic { net_faults > 0 && n420[k] > 0 -> net_faults--; n420[k]-- } \
  :: atomic { net_faults > 0 && n430[k] > 0 -> net_faults--; n430[k]-- } \
  :: atomic { net_faults > 0 && n400[k] > 0 -> net_faults--; n400[k]-- } \
  :: atomic { net_faults > 0 && n410[k] > 0 -> net_faults--; n410[k]-- } \
  /* a repeated advice while the first is on its way (its attempt timed out); a repeated \
     acknowledgement */ \
  :: atomic { net_faults > 0 && n420[k] == 1 -> net_faults--; n420[k]++ } \
  :: atomic { net_faults > 0 && n430[k] == 1 -> net_faults--; n430[k]++ } \
  /* the lease holder stalls past lease_until (GC, swap, SIGSTOP); it does not know */ \
  :: atomic { pauses > 0 && k_state[k] == PROC && k_live[k] -> pauses--; k_live[k] = 0 }

active proctype World()
{
end_world:
  do
  NET_LOSS(0)
#if NK > 1
  NET_LOSS(1)
#endif
#ifdef FAIR
  :: atomic { net_faults > 0 || crashes > 0 || pauses > 0 ->
              net_faults = 0; crashes = 0; pauses = 0 }
#endif
  od
}

init {
  c_code {
    now.net_faults = pml_budget("PML_NET_FAULTS", now.net_faults);
    now.crashes = pml_budget("PML_CRASHES", now.crashes);
    now.pauses = pml_budget("PML_PAUSES", now.pauses);
  };
  atomic {
    run Create(0);
#if NK > 1
    run Create(1);
#endif
#ifdef ABORTS
    run Abort(0);
#if NK > 1
    run Abort(1);
#endif
#endif
#ifdef REVERSAL
    run Reversal(0);
#if NK > 1
    run Reversal(1);
#endif
#endif
  }
}

/* ======================================================================== properties */
#define ONE_0200(k) (a_recv[k] <= 1)
/* the queue has drained for key k: settled (not processing) and its advice, if any,
   acknowledged */
#define DRAINED(k) (k_state[k] != PROC && adv[k] != ADV_QUEUED)
#define NET_MATCH(k) (!DRAINED(k) || \
                      ((a_auth[k] == AU_APPR && !a_rev[k]) == (k_state[k] == APPR)))
#if NK > 1
#define P_L (ONE_0200(0) && ONE_0200(1))
#define P_M (NET_MATCH(0) && NET_MATCH(1))
#define ALL_DRAINED (DRAINED(0) && DRAINED(1))
#else
#define P_L ONE_0200(0)
#define P_M NET_MATCH(0)
#define ALL_DRAINED DRAINED(0)
#endif

#ifndef CHK_L
#define CHK_L 1
#endif
#ifndef CHK_M
#define CHK_M 1
#endif
#define Q_L (!CHK_L || P_L)
#define Q_M (!CHK_M || P_M)
#ifdef MONITOR
/* Blocks until an invariant breaks, then the failing assertion names it. l and m are
   checked in every reachable state. -DM_AT_END: m is checked only when the run has
   ended (nothing can move: every fault the world was going to inject is spent, every
   advice it could send was sent) -- the literal reading of §3.8 (b), "once the queue has
   drained"; MUTANT_SETTLE_THEN_QUEUE's check uses it, so that its trail must show what
   loses the advice (a crash between the two commits), not merely the window between them
   that the per-state form flags. */
active proctype Monitor()
{
end_monitor:
  atomic {
#ifdef M_AT_END
    (!Q_L || (timeout && !Q_M)) ->
#else
    !(Q_L && Q_M) ->
#endif
    assert(Q_L); assert(Q_M)
  }
}
#endif

ltl l { [] P_L }
ltl m { [] P_M }
ltl n { <> [] ALL_DRAINED }
