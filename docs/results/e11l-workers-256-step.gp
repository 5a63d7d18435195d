set terminal pngcairo size 900,560 noenhanced
set output 'e11l-workers-256-step.png'
set title 'E11, part 2: 256 and 1,024 nano workers on 50 ms links, GASLoC against DiLoCo with a tree all-reduce [workers=256]'
set xlabel 'training step (inner steps)'
set ylabel 'validation loss (nats per token, average model)'
set grid
set key top right
plot 'e11l-workers-256-step.dat' index 0 with linespoints title 'diloco', 'e11l-workers-256-step.dat' index 1 with linespoints title 'gasloc-1peer', 'e11l-workers-256-step.dat' index 2 with linespoints title 'gasloc-2peer', 5.9302412078695514 with lines dashtype 2 linecolor 'gray40' title 'unigram baseline (5.930)'
