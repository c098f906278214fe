// Command threadbench is the Go baseline of activm's thread micro-benchmarks: the same
// operations, arguments and output as the NPTL baseline (../nptl.rs) and the activm guest
// (guests/apps/threadbench). benches/benches/threads.rs builds and runs it with GOMAXPROCS=2.
//
// usage: threadbench OP [key=value ...]
//
//	null-fork       trials= iters=               start a goroutine with an empty body, wait for it
//	signal-wait     trials= iters=               sync.Mutex+sync.Cond ping-pong; iters round trips
//	yield           trials= iters=               2 goroutines on one P (GOMAXPROCS(1)), iters Gosched each
//	mutex           trials= iters=               uncontended sync.Mutex Lock+Unlock
//	mutex-contended trials= iters=               2 goroutines, iters acquisitions each
//	create          trials= total= top= children=    NPTL paper: thread creation
//	contention      trials= total= threads= regions= NPTL paper: lock contention (csfast)
//
// Output: one line "BENCH OP v1 v2 ...", one value per trial in nanoseconds: per operation
// (per signal-wait = round trip / 2, per yield, per acquisition) for the first five, the
// trial's total time for create and contention. One untimed warm-up trial runs first (not for
// create, whose 100,000 creations warm up by themselves).
package main

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
)

func usage(why string) {
	fmt.Fprintf(os.Stderr, "threadbench (go): %s\nusage: threadbench OP [key=value ...] (see the source header)\n", why)
	os.Exit(2)
}

type params map[string]uint64

func (p params) get(key string) uint64 {
	v, ok := p[key]
	if !ok || v == 0 {
		usage("missing or zero " + key + "=")
	}
	return v
}

func main() {
	if len(os.Args) < 2 {
		usage("missing OP")
	}
	op := os.Args[1]
	p := params{}
	for _, a := range os.Args[2:] {
		k, v, ok := strings.Cut(a, "=")
		if !ok {
			usage("bad argument " + a)
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			usage("bad number in " + a)
		}
		p[k] = n
	}
	trials := p.get("trials")
	var run func() float64
	switch op {
	case "null-fork":
		iters := p.get("iters")
		run = func() float64 { return nullFork(iters) }
	case "signal-wait":
		iters := p.get("iters")
		run = func() float64 { return signalWait(iters) }
	case "yield":
		iters := p.get("iters")
		// Two runnable goroutines on one CPU: one P.
		runtime.GOMAXPROCS(1)
		run = func() float64 { return yieldPair(iters) }
	case "mutex":
		iters := p.get("iters")
		run = func() float64 { return mutexUncontended(iters) }
	case "mutex-contended":
		iters := p.get("iters")
		run = func() float64 { return mutexContended(iters) }
	case "create":
		total, top, children := p.get("total"), p.get("top"), p.get("children")
		run = func() float64 { return create(total, top, children) }
	case "contention":
		total, threads, regions := p.get("total"), p.get("threads"), p.get("regions")
		run = func() float64 { return contention(total, threads, regions) }
	default:
		usage("unknown OP " + op)
	}
	fmt.Printf("INFO go=%s GOMAXPROCS=%d\n", runtime.Version(), runtime.GOMAXPROCS(0))
	if op != "create" {
		run() // warm-up
	}
	samples := make([]string, 0, trials)
	for i := uint64(0); i < trials; i++ {
		samples = append(samples, strconv.FormatFloat(run(), 'f', 1, 64))
	}
	fmt.Printf("BENCH %s %s\n", op, strings.Join(samples, " "))
}

func nsSince(t0 time.Time) float64 {
	return float64(time.Since(t0).Nanoseconds())
}

// gate: goroutines wait until the timer has started.
type gate struct {
	mu   sync.Mutex
	cv   *sync.Cond
	open bool
}

func newGate() *gate {
	g := &gate{}
	g.cv = sync.NewCond(&g.mu)
	return g
}

func (g *gate) wait() {
	g.mu.Lock()
	for !g.open {
		g.cv.Wait()
	}
	g.mu.Unlock()
}

func (g *gate) start() {
	g.mu.Lock()
	g.open = true
	g.mu.Unlock()
	g.cv.Broadcast()
}

func nullFork(iters uint64) float64 {
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := uint64(0); i < iters; i++ {
		wg.Add(1)
		go func() { wg.Done() }()
		wg.Wait()
	}
	return nsSince(t0) / float64(iters)
}

// Ping-pong through one mutex-protected counter: odd = the partner's turn, even = ours.
// A round trip is two signal-waits (each side signals the other, then waits).
func signalWait(iters uint64) float64 {
	const warm = 16
	var mu sync.Mutex
	cv := sync.NewCond(&mu)
	turn := uint64(0)
	done := make(chan struct{})
	go func() {
		mu.Lock()
		for i := uint64(0); i < warm+iters; i++ {
			for turn%2 == 0 {
				cv.Wait()
			}
			turn++
			cv.Signal()
		}
		mu.Unlock()
		close(done)
	}()
	roundTrip := func() {
		mu.Lock()
		turn++
		cv.Signal()
		for turn%2 == 1 {
			cv.Wait()
		}
		mu.Unlock()
	}
	for i := 0; i < warm; i++ {
		roundTrip()
	}
	t0 := time.Now()
	for i := uint64(0); i < iters; i++ {
		roundTrip()
	}
	ns := nsSince(t0)
	<-done
	return ns / float64(2*iters)
}

// Two goroutines on one P, each calling runtime.Gosched iters times: time per yield.
func yieldPair(iters uint64) float64 {
	g := newGate()
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() {
			g.wait()
			for j := uint64(0); j < iters; j++ {
				runtime.Gosched()
			}
			wg.Done()
		}()
	}
	runtime.Gosched() // let both reach the gate
	t0 := time.Now()
	g.start()
	wg.Wait()
	return nsSince(t0) / float64(2*iters)
}

var sink uint64

func mutexUncontended(iters uint64) float64 {
	var mu sync.Mutex
	count := uint64(0)
	t0 := time.Now()
	for i := uint64(0); i < iters; i++ {
		mu.Lock()
		count++
		mu.Unlock()
	}
	ns := nsSince(t0)
	if count != iters {
		panic("mutex: lost updates")
	}
	sink += count
	return ns / float64(iters)
}

// Two goroutines (GOMAXPROCS=2: two CPUs) hammering one lock: time per acquisition.
func mutexContended(iters uint64) float64 {
	g := newGate()
	var mu sync.Mutex
	count := uint64(0)
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() {
			g.wait()
			for j := uint64(0); j < iters; j++ {
				mu.Lock()
				count++
				mu.Unlock()
			}
			wg.Done()
		}()
	}
	t0 := time.Now()
	g.start()
	wg.Wait()
	ns := nsSince(t0)
	if count != 2*iters {
		panic("mutex-contended: lost updates")
	}
	return ns / float64(2*iters)
}

// share: n split over parts, the share of part i.
func share(n, parts, i uint64) uint64 {
	s := n / parts
	if i < n%parts {
		s++
	}
	return s
}

// The NPTL paper's creation test: top top-level goroutines together create total goroutines
// with empty bodies; each keeps at most children alive, waiting for its oldest before
// creating another. Total time from the first top-level creation to the last join.
func create(total, top, children uint64) float64 {
	t0 := time.Now()
	var wg sync.WaitGroup
	for i := uint64(0); i < top; i++ {
		quota := share(total, top, i)
		wg.Add(1)
		go func() {
			alive := make([]chan struct{}, 0, children)
			for j := uint64(0); j < quota; j++ {
				if uint64(len(alive)) == children {
					<-alive[0]
					alive = alive[1:]
				}
				done := make(chan struct{})
				go func() { close(done) }()
				alive = append(alive, done)
			}
			for _, done := range alive {
				<-done
			}
			wg.Done()
		}()
	}
	wg.Wait()
	return nsSince(t0)
}

// region: a critical region, a lock and the counter it protects, on its own cache line.
type region struct {
	mu    sync.Mutex
	count uint64
	_     [48]byte
}

// The NPTL paper's contention test (csfast): threads goroutines enter regions critical regions
// total times in all, each entry picking a region pseudo-randomly. Total time from opening the
// start gate to the last join.
func contention(total, threads, nregions uint64) float64 {
	g := newGate()
	regions := make([]region, nregions)
	var wg sync.WaitGroup
	for i := uint64(0); i < threads; i++ {
		quota := share(total, threads, i)
		x := seed(i)
		wg.Add(1)
		go func() {
			g.wait()
			for j := uint64(0); j < quota; j++ {
				x = xorshift(x)
				r := &regions[x%nregions]
				r.mu.Lock()
				r.count++
				r.mu.Unlock()
			}
			wg.Done()
		}()
	}
	t0 := time.Now()
	g.start()
	wg.Wait()
	ns := nsSince(t0)
	entered := uint64(0)
	for i := range regions {
		entered += regions[i].count
	}
	if entered != total {
		panic("contention: lost entries")
	}
	return ns
}

// seed: the per-thread random seed all three implementations use.
func seed(thread uint64) uint64 {
	return 0x9E3779B97F4A7C15*(thread+1) | 1
}

func xorshift(x uint64) uint64 {
	x ^= x << 13
	x ^= x >> 7
	x ^= x << 17
	return x
}
