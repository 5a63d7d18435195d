set terminal pngcairo size 900,560 noenhanced
set output 'e2b-workers-32-step.png'
set title 'E2b: H = 30 on 16 and 32 workers, GASLoC against DiLoCo [workers=32]'
set xlabel 'training step (inner steps)'
set ylabel 'validation loss (nats per token, average model)'
set grid
set key top right
plot 'e2b-workers-32-step.dat' index 0 with linespoints title 'diloco', 'e2b-workers-32-step.dat' index 1 with linespoints title 'gasloc-2peer', 5.9302412078695514 with lines dashtype 2 linecolor 'gray40' title 'unigram baseline (5.930)'
